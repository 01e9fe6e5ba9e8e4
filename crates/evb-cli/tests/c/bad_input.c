/* libevb given bad input through its C interface: every call returns an
 * error code with a message that names what is wrong, and nothing
 * crashes, hangs or unwinds into C. Prints one line per check; exit status
 * 0 only if every check held.
 *
 * Arguments: an empty directory (no run in it), and an object file whose
 * header claims more events than any memory holds. */
#include <evb.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

static void expect(const char *what, int got, int want, const char *needle) {
    const char *msg = evb_last_error();
    int ok = got == want && (needle == NULL || strstr(msg, needle) != NULL);
    printf("%s %s: %s (%d): %s\n", ok ? "ok" : "FAIL", what, evb_status_name(got), got, msg);
    if (!ok) failures++;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    evb_consumer *c = NULL;
    evb_batch *b = NULL;
    evb_store *s = NULL;
    evb_object *o = NULL;
    evb_consumer_options opts;

    expect("options_init(NULL)", evb_consumer_options_init(NULL), EVB_ERR_ARG, "options is NULL");
    expect("open(NULL)", evb_consumer_open(NULL, &c), EVB_ERR_ARG, "options is NULL");
    evb_consumer_options_init(&opts);
    expect("open without rendezvous", evb_consumer_open(&opts, &c), EVB_ERR_ARG,
           "options->rendezvous is NULL");
    opts.rendezvous = argv[1];
    opts.wait_ms = 0;
    expect("open on a directory with no run", evb_consumer_open(&opts, &c), EVB_ERR_RUN, argv[1]);
    opts.run_id = 7;
    expect("open of a run not there", evb_consumer_open(&opts, &c), EVB_ERR_RUN, "no run 7");
    opts.run_id = 1L << 40;
    expect("open with a run id too large", evb_consumer_open(&opts, &c), EVB_ERR_ARG, "too large");
    opts.run_id = -1;
    opts.n_overrides = 1;
    expect("overrides NULL with a count", evb_consumer_open(&opts, &c), EVB_ERR_ARG,
           "options->overrides is NULL");
    expect("next(NULL)", evb_consumer_next(NULL, 0, &b), EVB_ERR_ARG, "consumer is NULL");
    expect("release(NULL batch)", evb_batch_release(NULL), EVB_ERR_ARG, "batch is NULL");
    expect("batch_get_info(NULL)", evb_batch_get_info(NULL, NULL), EVB_ERR_ARG, "is NULL");
    expect("close(NULL)", evb_consumer_close(NULL), EVB_ERR_ARG, "consumer is NULL");

    expect("store_open(NULL)", evb_store_open(NULL, 0, &s), EVB_ERR_ARG, "target is NULL");
    expect("store_open(missing)", evb_store_open("/nonexistent/evb-store", 0, &s), EVB_ERR_STORE,
           "/nonexistent/evb-store");
    expect("store_open(bad s3)", evb_store_open("s3://", 0, &s), EVB_ERR_STORE, "s3://");
    expect("store_open(object)", evb_store_open(argv[2], 0, &s), EVB_OK, NULL);
    expect("store_next(huge claim)", evb_store_next(s, &o), EVB_ERR_CORRUPT, argv[2]);
    expect("store_next(end)", evb_store_next(s, &o), EVB_END, NULL);
    expect("object_event(NULL)", evb_object_event(NULL, 0, NULL, NULL), EVB_ERR_ARG, "is NULL");
    evb_store_close(s);
    evb_store_close(NULL);
    evb_object_free(NULL);
    printf("%s\n", strcmp(evb_status_name(12345), "unknown status") == 0 ? "ok status names" : "FAIL status names");
    printf("version %s\n", evb_version());
    return failures == 0 ? 0 : 1;
}
