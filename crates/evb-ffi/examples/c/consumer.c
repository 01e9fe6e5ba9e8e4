/* A Filter Unit in C: joins a running event builder through libevb and
 * consumes built batches until the end of the run.
 *
 *   evb run -n 2 --consumers 1 --external-consumers 1 --rendezvous /tmp/rdv &
 *   ./consumer /tmp/rdv            # checks every event's number
 *   ./consumer /tmp/rdv --no-check # only takes the batches (benchmarks)
 *
 * Build: cc consumer.c $(pkg-config --cflags --libs evb) -o consumer
 *
 * Prints one line at the end:
 *   consumer rank R: batches B events E bytes Y bad_events X lost_bus L
 */
#include <evb.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Each event starts with its number, mep * events + e (u64, little-endian). */
static uint64_t event_number(evb_bytes ev) {
    uint64_t n = 0;
    size_t k = ev.len < 8 ? ev.len : 8;
    for (size_t i = 0; i < k; i++) n |= (uint64_t)ev.data[i] << (8 * i);
    return n;
}

/* Counts the events of batch b whose fragments do not carry their number. */
static uint64_t check_events(const evb_batch *b, const evb_batch_info *info) {
    uint64_t bad = 0;
    for (uint32_t e = 0; e < info->events; e++) {
        uint64_t want = info->mep * info->events + e;
        for (uint32_t s = 0; s < info->sources; s++) {
            evb_bytes ev;
            if (evb_batch_event(b, e, s, &ev) != EVB_OK) {
                fprintf(stderr, "consumer: %s\n", evb_last_error());
                bad++;
                continue;
            }
            /* An event shorter than 8 bytes holds the first bytes only. */
            uint64_t mask = ev.len >= 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * ev.len)) - 1);
            if (ev.len > 0 && event_number(ev) != (want & mask)) bad++;
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s RENDEZVOUS_DIR [--no-check]\n", argv[0]);
        return 2;
    }
    int check = !(argc > 2 && strcmp(argv[2], "--no-check") == 0);

    evb_consumer_options opts;
    evb_consumer_options_init(&opts);
    opts.rendezvous = argv[1];
    evb_consumer *c = NULL;
    if (evb_consumer_open(&opts, &c) != EVB_OK) {
        fprintf(stderr, "consumer: %s\n", evb_last_error());
        return 1;
    }

    uint64_t batches = 0, events = 0, bytes = 0, bad = 0, lost = 0;
    for (;;) {
        evb_batch *b = NULL;
        int st = evb_consumer_next(c, 1000, &b);
        if (st == EVB_END) break;
        if (st == EVB_TIMEOUT) continue;
        if (st == EVB_BU_LOST) {
            const char *why = NULL;
            int bu = evb_consumer_lost_bu(c, &why);
            fprintf(stderr, "consumer: BU %d lost: %s\n", bu, why ? why : "");
            lost++;
            continue;
        }
        if (st != EVB_OK) {
            fprintf(stderr, "consumer: %s: %s\n", evb_status_name(st), evb_last_error());
            evb_consumer_close(c);
            return 1;
        }
        evb_batch_info info;
        evb_batch_get_info(b, &info);
        batches++;
        events += info.events;
        bytes += info.payload.len;
        if (check) bad += check_events(b, &info);
        if (evb_consumer_release(c, b) != EVB_OK) {
            fprintf(stderr, "consumer: %s\n", evb_last_error());
            return 1;
        }
    }

    evb_consumer_stats stats;
    evb_consumer_get_stats(c, &stats);
    printf("consumer rank %u: batches %" PRIu64 " events %" PRIu64 " bytes %" PRIu64
           " bad_events %" PRIu64 " lost_bus %" PRIu64 "\n",
           stats.rank, batches, events, bytes, bad, lost);
    if (evb_consumer_close(c) != EVB_OK) {
        fprintf(stderr, "consumer: %s\n", evb_last_error());
        return 1;
    }
    return bad == 0 ? 0 : 1;
}
