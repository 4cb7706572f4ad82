/* whsig: the Standard Webhooks signature. A subscription's secret is
 * "whsec_<base64 of its key>"; a delivery is signed with HMAC-SHA256 over
 * id "." timestamp "." body (OpenSSL's libcrypto). Pure: no I/O, no state. */
#ifndef WORKD_WHSIG_H
#define WORKD_WHSIG_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define WHSIG_KEY_MIN 24 /* bytes of a secret's key, at least */
#define WHSIG_KEY_MAX 64 /* ...and at most */
#define WHSIG_LEN 64     /* "v1," + base64 of 32 bytes + NUL fit */

/* The key of a secret "whsec_<base64>" (WHSIG_KEY_MIN to WHSIG_KEY_MAX bytes)
 * into key (WHSIG_KEY_MAX bytes). Returns -1 if it is not one. */
int whsig_key(const char *secret, unsigned char *key, size_t *keylen) WARN_UNUSED;
/* "v1,<base64 of HMAC-SHA256(key, id "." timestamp "." body)>" into out
 * (WHSIG_LEN bytes). */
int whsig_sign(const unsigned char *key, size_t keylen, const char *id, int64_t timestamp,
               const char *body, size_t len, char *out) WARN_UNUSED;

#endif
