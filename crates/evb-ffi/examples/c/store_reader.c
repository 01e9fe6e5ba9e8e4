/* Reads an event store (a directory or s3://bucket/prefix?endpoint=URL)
 * batch by batch through libevb: every object verified, every event's
 * fragments checked against the object's sources and event numbers.
 *
 *   ./store_reader /data/evb
 *
 * Build: cc store_reader.c $(pkg-config --cflags --libs evb) -o store_reader
 *
 * Prints one line at the end:
 *   store: objects N events E bytes Y bad_objects X bad_events Z
 * and one line per bad object on stderr. Exit status 1 if anything was bad.
 */
#include <evb.h>

#include <inttypes.h>
#include <stdio.h>

/* Each event starts with its number within the run, mep * mep_events + e
 * (u64, little-endian; an event shorter than 8 bytes holds its first
 * bytes only). */
static int carries_number(evb_bytes f, uint64_t want) {
    uint64_t n = 0;
    size_t k = f.len < 8 ? f.len : 8;
    for (size_t i = 0; i < k; i++) n |= (uint64_t)f.data[i] << (8 * i);
    uint64_t mask = k == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * k)) - 1);
    return f.len == 0 || n == (want & mask);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s STORE\n", argv[0]);
        return 2;
    }
    evb_store *s = NULL;
    if (evb_store_open(argv[1], 0, &s) != EVB_OK) {
        fprintf(stderr, "store_reader: %s\n", evb_last_error());
        return 2;
    }
    uint64_t objects = 0, events = 0, bytes = 0, bad_objects = 0, bad_events = 0;
    for (;;) {
        evb_object *o = NULL;
        int st = evb_store_next(s, &o);
        if (st == EVB_END) break;
        if (st == EVB_ERR_CORRUPT) {
            fprintf(stderr, "bad: %s\n", evb_last_error());
            bad_objects++;
            continue;
        }
        if (st != EVB_OK) {
            fprintf(stderr, "store_reader: %s\n", evb_last_error());
            evb_store_close(s);
            return 2;
        }
        evb_object_info info;
        evb_object_get_info(o, &info);
        objects++;
        for (uint32_t e = 0; e < info.events; e++) {
            evb_bytes ev;
            uint32_t number;
            evb_object_event(o, e, &ev, &number);
            bytes += ev.len;
            events++;
            for (uint32_t col = 0; col < info.sources; col++) {
                evb_bytes f;
                uint32_t source;
                evb_object_fragment(o, e, col, &f, &source);
                if (!carries_number(f, info.mep * info.mep_events + number)) {
                    fprintf(stderr, "%s: event %u source %u: wrong event number\n", info.name,
                            number, source);
                    bad_events++;
                }
            }
        }
        evb_object_free(o);
    }
    evb_store_close(s);
    printf("store: objects %" PRIu64 " events %" PRIu64 " bytes %" PRIu64 " bad_objects %" PRIu64
           " bad_events %" PRIu64 "\n",
           objects, events, bytes, bad_objects, bad_events);
    return bad_objects == 0 && bad_events == 0 ? 0 : 1;
}
