/* siphash: see siphash.h. Follows the reference implementation
 * (github.com/veorq/SipHash); tests/unit/test_hmap.c checks its vectors. */
#include "siphash.h"

#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

uint64_t siphash(const uint8_t key[16], const void *data, size_t len, int c_rounds, int d_rounds)
{
    const uint8_t *in = data;
    uint64_t k0 = le64(key), k1 = le64(key + 8);
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
    const uint8_t *end = in + len - len % 8;
    for (; in != end; in += 8) {
        uint64_t m = le64(in);
        v3 ^= m;
        for (int i = 0; i < c_rounds; i++)
            SIPROUND;
        v0 ^= m;
    }
    uint8_t last[8] = {0};
    memcpy(last, in, len % 8);
    uint64_t b = ((uint64_t)len << 56) | le64(last);
    v3 ^= b;
    for (int i = 0; i < c_rounds; i++)
        SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    for (int i = 0; i < d_rounds; i++)
        SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static uint8_t process_key[16];
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void draw_key(void)
{
    size_t got = 0;
    while (got < sizeof process_key) {
        ssize_t n = getrandom(process_key + got, sizeof process_key - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got == sizeof process_key)
        return;
    /* No kernel randomness (a seccomp filter, an ancient kernel): a key from the
     * clock, the pid and an address still differs per process and per start,
     * which is far better than a fixed one. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t a = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)getpid();
    uint64_t b = (uint64_t)(uintptr_t)&ts ^ (uint64_t)(uintptr_t)&process_key;
    memcpy(process_key, &a, 8);
    memcpy(process_key + 8, &b, 8);
}

uint64_t siphash_str(const char *s)
{
    pthread_once(&key_once, draw_key);
    return siphash(process_key, s, strlen(s), 1, 3);
}
