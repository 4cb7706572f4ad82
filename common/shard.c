/* shard: the queue -> shard hash (shard.h). */
#include "shard.h"

uint32_t shard_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h;
}

int shard_of_queue(const char *queue, int n)
{
    return n <= 1 ? 0 : (int)(shard_hash(queue) % (uint32_t)n);
}
