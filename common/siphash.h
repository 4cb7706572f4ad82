/* siphash: SipHash (Aumasson and Bernstein, 2012), a keyed pseudo-random
 * function. Without the key, nobody can compute inputs whose hashes collide,
 * which is what a hash table keyed by ids that others choose needs. */
#ifndef WORKD_SIPHASH_H
#define WORKD_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-c-d of data[0, len) under the 128-bit key (little-endian words, as
 * in the paper): c_rounds 2 and d_rounds 4 give SipHash-2-4, 1 and 3 the
 * faster SipHash-1-3 that hash tables use. */
uint64_t siphash(const uint8_t key[16], const void *data, size_t len, int c_rounds, int d_rounds);

/* SipHash-1-3 of a NUL-terminated string under this process's key: 128 random
 * bits from getrandom(2), drawn once at first use (thread-safe). */
uint64_t siphash_str(const char *s);

#endif
