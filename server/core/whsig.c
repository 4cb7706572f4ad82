/* whsig: see whsig.h. */
#include "whsig.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdbool.h>
#include <string.h>

#include "util.h"

int whsig_key(const char *secret, unsigned char *key, size_t *keylen)
{
    if (!secret || strncmp(secret, "whsec_", 6) != 0)
        return -1;
    const char *b64 = secret + 6;
    size_t n = strlen(b64);
    if (n == 0 || n % 4 != 0 || n > 4 * ((WHSIG_KEY_MAX + 2) / 3))
        return -1;
    for (size_t i = 0; i < n; i++) {
        char c = b64[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '+' || c == '/' || (c == '=' && i >= n - 2);
        if (!ok || (c != '=' && i > 0 && b64[i - 1] == '='))
            return -1;
    }
    unsigned char buf[4 * ((WHSIG_KEY_MAX + 2) / 3)];
    int len = EVP_DecodeBlock(buf, (const unsigned char *)b64, (int)n);
    if (len < 0)
        return -1;
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    len -= (b64[n - 1] == '=') + (b64[n - 2] == '=');
    if (len < WHSIG_KEY_MIN || len > WHSIG_KEY_MAX)
        return -1;
    memcpy(key, buf, (size_t)len);
    *keylen = (size_t)len;
    return 0;
}

int whsig_sign(const unsigned char *key, size_t keylen, const char *id, int64_t timestamp,
               const char *body, size_t len, char *out)
{
    SBuf msg;
    sbuf_init(&msg);
    sbuf_printf(&msg, "%s.%lld.", id, (long long)timestamp);
    sbuf_append(&msg, body, len);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0;
    unsigned char *ok = HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg.data,
                             msg.len, mac, &maclen);
    sbuf_free(&msg);
    if (!ok || maclen != 32)
        return -1;
    memcpy(out, "v1,", 3);
    EVP_EncodeBlock((unsigned char *)out + 3, mac, (int)maclen); /* 44 chars and a NUL */
    return 0;
}
