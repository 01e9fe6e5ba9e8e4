/* fi_bw: point-to-point bandwidth and latency over a libfabric RDM endpoint.
 *
 * Why: `evb bench p2p --transport ofi:PROV` needs a reference that is plain
 * libfabric with nothing of evb in it, and Debian ships no fabtests. This is
 * written from the libfabric man pages (fi_getinfo, fi_endpoint, fi_cq,
 * fi_tagged, fi_av) and uses the same recipe as evb-ofi: FI_EP_RDM,
 * FI_TAGGED, FI_ORDER_SAS, a tagged-format CQ, an FI_AV_TABLE.
 *
 * Two processes: the server (no address argument) and the client (the
 * server's host). They swap libfabric addresses over a TCP socket, then for
 * each size 64 B .. 4 MiB (powers of two) the client streams messages with a
 * window in flight while the server keeps a window of receives posted, and
 * a ping-pong gives the latency. The client prints one line per size:
 *     size_bytes  MB/s  half-round-trip_us
 *
 * usage: fi_bw [-p PROVIDER] [-d DOMAIN] [-P PORT] [-w WINDOW] [-m MAX_SIZE] [-s MIN_SIZE] [-V MIB] [-B] [-t SECONDS] [SERVER_HOST]
 *   PROVIDER as users write it: tcp (tcp;ofi_rxm), udp (udp;ofi_rxd), shm,
 *   verbs (verbs;ofi_rxm) or an exact fi_info name. -B: block on the CQ's
 *   wait fd instead of spinning. -t: give up after SECONDS (default 300).
 *   -s: first size (a power of two; default 64). -V: MiB streamed per size
 *   (default 256; a ratio against evb wants seconds, e.g. -V 16384).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#define MIN_SIZE 64
#define MAX_SIZE (4u << 20)
#define MAX_WINDOW 1024

enum { TAG_BW = 1, TAG_ACK = 2, TAG_LAT = 3 };

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_ep *ep;
static fi_addr_t peer;
static int blocking, cq_fd = -1;
static char *tx_buf, *rx_buf; /* rx_buf: one MAX_SIZE slot per window entry */
static struct fid_mr *tx_mr, *rx_mr;
static void *tx_desc, *rx_desc;
/* With FI_CONTEXT the provider owns an operation's context until it
 * completes, so every send in flight needs its own: a free list of them. */
static struct fi_context2 rx_ctx[MAX_WINDOW], tx_ctx[MAX_WINDOW + 1];
static int tx_free[MAX_WINDOW + 1], tx_nfree;
static int window = 64;
static size_t max_size = MAX_SIZE; /* -m: stop after this size */
static size_t min_size = MIN_SIZE; /* -s: start at this size */
static size_t volume_mib = 256;    /* -V: MiB streamed per size */

static void die(const char *what, long ret)
{
	fprintf(stderr, "fi_bw: %s: %s (%ld)\n", what, fi_strerror((int)-ret), ret);
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *provider_name(const char *user)
{
	if (!strcmp(user, "tcp")) return "tcp;ofi_rxm";
	if (!strcmp(user, "udp")) return "udp;ofi_rxd";
	if (!strcmp(user, "verbs")) return "verbs;ofi_rxm";
	return user;
}

static void open_endpoint(const char *prov, const char *dom)
{
	struct fi_info *hints = fi_allocinfo(), *list, *cur;
	int ret;

	hints->caps = FI_TAGGED;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->ep_attr->type = FI_EP_RDM;
	hints->tx_attr->msg_order = FI_ORDER_SAS;
	hints->rx_attr->msg_order = FI_ORDER_SAS;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
	hints->fabric_attr->prov_name = strdup(provider_name(prov));
	ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &list);
	if (ret) {
		fprintf(stderr, "fi_bw: no RDM tagged endpoint for provider %s: %s (see fi_info -l)\n",
			provider_name(prov), fi_strerror(-ret));
		exit(1);
	}
	fi_freeinfo(hints);
	/* Layered providers may ignore a domain hint: choose by name here. */
	for (cur = list; cur; cur = cur->next)
		if (!dom || !strcmp(cur->domain_attr->name, dom))
			break;
	if (!cur) {
		fprintf(stderr, "fi_bw: provider %s has no domain %s\n", provider_name(prov), dom);
		exit(1);
	}
	info = fi_dupinfo(cur);
	fi_freeinfo(list);

	if ((ret = fi_fabric(info->fabric_attr, &fabric, NULL))) die("fi_fabric", ret);
	if ((ret = fi_domain(fabric, info, &domain, NULL))) die("fi_domain", ret);

	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	if ((ret = fi_av_open(domain, &av_attr, &av, NULL))) die("fi_av_open", ret);

	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED,
				      .wait_obj = blocking ? FI_WAIT_FD : FI_WAIT_NONE };
	if ((ret = fi_cq_open(domain, &cq_attr, &cq, NULL))) die("fi_cq_open", ret);
	if (blocking && (ret = fi_control(&cq->fid, FI_GETWAIT, &cq_fd))) {
		fprintf(stderr, "fi_bw: %s has no wait fd (%s): busy-polling instead\n", info->fabric_attr->prov_name,
			fi_strerror(-ret));
		blocking = 0;
	}

	if ((ret = fi_endpoint(domain, info, &ep, NULL))) die("fi_endpoint", ret);
	if ((ret = fi_ep_bind(ep, &av->fid, 0))) die("fi_ep_bind(av)", ret);
	if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV))) die("fi_ep_bind(cq)", ret);
	if ((ret = fi_enable(ep))) die("fi_enable", ret);
	for (int i = 0; i < MAX_WINDOW + 1; i++) tx_free[tx_nfree++] = i;

	tx_buf = aligned_alloc(4096, MAX_SIZE);
	rx_buf = aligned_alloc(4096, (size_t)MAX_SIZE * window);
	if (!tx_buf || !rx_buf) {
		fprintf(stderr, "fi_bw: out of memory for a window of %d x %u bytes\n", window, MAX_SIZE);
		exit(1);
	}
	memset(tx_buf, 0xA5, MAX_SIZE);
	if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
		if ((ret = fi_mr_reg(domain, tx_buf, MAX_SIZE, FI_SEND, 0, 0, 0, &tx_mr, NULL))) die("fi_mr_reg", ret);
		if ((ret = fi_mr_reg(domain, rx_buf, (size_t)MAX_SIZE * window, FI_RECV, 0, 0, 0, &rx_mr, NULL)))
			die("fi_mr_reg", ret);
		tx_desc = fi_mr_desc(tx_mr);
		rx_desc = fi_mr_desc(rx_mr);
	}
}

/* Returns one completion's context without waiting, or NULL if none.
 * Reading the CQ is also what drives providers with manual progress. */
static void *poll_completion(void)
{
	/* Entries are read in batches, as evb-ofi does, and handed out one by one. */
	static struct fi_cq_tagged_entry batch[32];
	static ssize_t next, have;
	if (next < have) return batch[next++].op_context;
	ssize_t n = fi_cq_read(cq, batch, 32);
	if (n > 0) {
		have = n;
		next = 1;
		return batch[0].op_context;
	}
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry err = { 0 };
		fi_cq_readerr(cq, &err, 0);
		fprintf(stderr, "fi_bw: operation failed: %s: %s\n", fi_strerror(err.err),
			fi_cq_strerror(cq, err.prov_errno, err.err_data, NULL, 0));
		exit(1);
	}
	if (n != -FI_EAGAIN) die("fi_cq_read", n);
	return NULL;
}

/* Waits for one completion (spinning, or sleeping on the wait fd with -B). */
static void *next_completion(void)
{
	for (;;) {
		void *c = poll_completion();
		if (c) return c;
		if (blocking) {
			struct fid *fids[1] = { &cq->fid };
			if (fi_trywait(fabric, fids, 1) == FI_SUCCESS) {
				struct pollfd p = { .fd = cq_fd, .events = POLLIN };
				poll(&p, 1, 100);
			}
		}
	}
}

/* Completions reaped so far; every wait is "until a counter reaches N". */
static long tx_done, rx_done;

static int is_tx(void *c)
{
	return (struct fi_context2 *)c >= tx_ctx && (struct fi_context2 *)c < tx_ctx + MAX_WINDOW + 1;
}

static void count(void *c)
{
	if (is_tx(c)) {
		tx_free[tx_nfree++] = (struct fi_context2 *)c - tx_ctx;
		tx_done++;
	} else {
		rx_done++;
	}
}

static void *reap(void)
{
	void *c = next_completion();
	count(c);
	return c;
}

static void post_recv(int slot, size_t size, uint64_t tag)
{
	ssize_t ret;
	while ((ret = fi_trecv(ep, rx_buf + (size_t)slot * MAX_SIZE, size, rx_desc, FI_ADDR_UNSPEC, tag, 0,
			       &rx_ctx[slot])) == -FI_EAGAIN) {
		void *c = poll_completion();
		if (c) count(c);
	}
	if (ret) die("fi_trecv", ret);
}

/* Callers never have a receive completing while they send (see the phases). */
static void post_send(size_t size, uint64_t tag)
{
	ssize_t ret;
	while (tx_nfree == 0) reap();
	int slot = tx_free[--tx_nfree];
	/* Try again after driving the library: a connection is being set up or
	 * the queue is full. No completion may come until the send is retried. */
	while ((ret = fi_tsend(ep, tx_buf, size, tx_desc, peer, tag, &tx_ctx[slot])) == -FI_EAGAIN) {
		void *c = poll_completion();
		if (c) count(c);
	}
	if (ret) die("fi_tsend", ret);
}

static int iterations(size_t size)
{
	size_t n = (volume_mib << 20) / size; /* -V MiB per size (default 256) */
	return n < 32 ? 32 : n > 20000000 ? 20000000 : (int)n;
}

static int lat_iterations(size_t size)
{
	return size <= 65536 ? 1000 : size <= (1 << 20) ? 100 : 30;
}

/* One 64-byte round trip so connection setup is not timed. */
static void warm_up(int client)
{
	long rx_target = rx_done + 1, tx_target = tx_done + 1;
	post_recv(0, MIN_SIZE, TAG_LAT);
	if (client) post_send(MIN_SIZE, TAG_LAT);
	while (rx_done < rx_target) reap();
	if (!client) post_send(MIN_SIZE, TAG_LAT);
	while (tx_done < tx_target) reap();
}

static void run_server(void)
{
	warm_up(0);
	for (size_t size = min_size; size <= max_size; size *= 2) {
		int n = iterations(size), posted = 0;
		long rx_target = rx_done + n;
		for (int s = 0; s < window && posted < n; s++, posted++) post_recv(s, size, TAG_BW);
		while (rx_done < rx_target) {
			void *c = reap();
			if (!is_tx(c) && posted < n) {
				post_recv((struct fi_context2 *)c - rx_ctx, size, TAG_BW);
				posted++;
			}
		}
		long tx_target = tx_done + 1;
		post_send(4, TAG_ACK);
		while (tx_done < tx_target) reap();
		for (int i = 0; i < lat_iterations(size); i++) {
			rx_target = rx_done + 1;
			post_recv(0, size, TAG_LAT);
			while (rx_done < rx_target) reap();
			tx_target = tx_done + 1;
			post_send(size, TAG_LAT);
			while (tx_done < tx_target) reap();
		}
	}
}

static void run_client(void)
{
	printf("# fi_bw provider %s domain %s window %d %s\n", info->fabric_attr->prov_name, info->domain_attr->name,
	       window, blocking ? "blocking" : "busy-poll");
	printf("# %10s %12s %10s\n", "size_B", "MB/s", "lat_us");
	fflush(stdout);
	warm_up(1);
	for (size_t size = min_size; size <= max_size; size *= 2) {
		int n = iterations(size), posted = 0;
		long tx_base = tx_done, rx_target = rx_done + 1;
		/* Stream n messages; the server's ack says all have arrived. */
		post_recv(0, 4, TAG_ACK);
		double t0 = now_s();
		while (rx_done < rx_target) {
			while (posted < n && posted - (tx_done - tx_base) < window) {
				post_send(size, TAG_BW);
				posted++;
			}
			if (rx_done < rx_target) reap();
		}
		double bw_s = now_s() - t0;
		while (tx_done - tx_base < n) reap();

		/* Ping-pong: half the round trip. */
		int lat_n = lat_iterations(size);
		double l0 = now_s();
		for (int i = 0; i < lat_n; i++) {
			long tx_target = tx_done + 1;
			rx_target = rx_done + 1;
			post_recv(0, size, TAG_LAT);
			post_send(size, TAG_LAT);
			while (rx_done < rx_target || tx_done < tx_target) reap();
		}
		double lat_us = (now_s() - l0) / lat_n / 2 * 1e6;
		printf("%12zu %12.1f %10.2f\n", size, (double)size * n / bw_s / 1e6, lat_us);
		fflush(stdout);
	}
}

/* Out-of-band address exchange over one TCP connection. */
static int oob_connect(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res;
	int fd = -1;
	if (host) {
		if (getaddrinfo(host, port, &hints, &res)) {
			fprintf(stderr, "fi_bw: cannot resolve %s\n", host);
			exit(1);
		}
		for (int tries = 0; tries < 100; tries++) { /* the server may still be starting */
			fd = socket(res->ai_family, SOCK_STREAM, 0);
			if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
			close(fd);
			fd = -1;
			usleep(100000);
		}
		freeaddrinfo(res);
		if (fd < 0) {
			fprintf(stderr, "fi_bw: cannot connect to %s:%s\n", host, port);
			exit(1);
		}
		return fd;
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(port)),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1)) {
		fprintf(stderr, "fi_bw: cannot listen on 127.0.0.1:%s: %s\n", port, strerror(errno));
		exit(1);
	}
	fd = accept(lfd, NULL, NULL);
	close(lfd);
	return fd;
}

static void exchange_addresses(int fd)
{
	char mine[256], theirs[256];
	size_t len = sizeof mine;
	uint32_t n, their_len;
	int ret = fi_getname(&ep->fid, mine, &len);
	if (ret) die("fi_getname", ret);
	n = htonl((uint32_t)len);
	if (write(fd, &n, 4) != 4 || write(fd, mine, len) != (ssize_t)len || read(fd, &n, 4) != 4) goto bad;
	their_len = ntohl(n);
	if (their_len > sizeof theirs) goto bad;
	for (size_t got = 0; got < their_len;) {
		ssize_t r = read(fd, theirs + got, their_len - got);
		if (r <= 0) goto bad;
		got += r;
	}
	if (fi_av_insert(av, theirs, 1, &peer, 0, NULL) != 1) {
		fprintf(stderr, "fi_bw: fi_av_insert rejected the peer's address\n");
		exit(1);
	}
	return;
bad:
	fprintf(stderr, "fi_bw: address exchange with the peer failed\n");
	exit(1);
}

int main(int argc, char **argv)
{
	const char *prov = "tcp", *dom = NULL, *port = "47592";
	int opt, seconds = 300;
	while ((opt = getopt(argc, argv, "p:d:P:w:m:s:V:Bt:h")) != -1) {
		switch (opt) {
		case 'p': prov = optarg; break;
		case 'd': dom = optarg; break;
		case 'P': port = optarg; break;
		case 'w': window = atoi(optarg); break;
		case 'm': max_size = strtoull(optarg, NULL, 0); break;
		case 's': min_size = strtoull(optarg, NULL, 0); break;
		case 'V': volume_mib = strtoull(optarg, NULL, 0); break;
		case 'B': blocking = 1; break;
		case 't': seconds = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-p PROVIDER] [-d DOMAIN] [-P PORT] [-w WINDOW] [-m MAX_SIZE] [-s MIN_SIZE] [-V MIB] [-B] [-t SECONDS] [SERVER_HOST]\n",
				argv[0]);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (max_size < MIN_SIZE || max_size > MAX_SIZE) {
		fprintf(stderr, "fi_bw: -m must be %d..%u\n", MIN_SIZE, MAX_SIZE);
		return 2;
	}
	if (min_size < MIN_SIZE || min_size > max_size || (min_size & (min_size - 1))) {
		fprintf(stderr, "fi_bw: -s must be a power of two, %d..MAX_SIZE\n", MIN_SIZE);
		return 2;
	}
	if (volume_mib < 1 || volume_mib > (1u << 20)) {
		fprintf(stderr, "fi_bw: -V must be 1..%u MiB\n", 1u << 20);
		return 2;
	}
	if (window < 1 || window > MAX_WINDOW) {
		fprintf(stderr, "fi_bw: -w must be 1..%d\n", MAX_WINDOW);
		return 2;
	}
	alarm(seconds > 0 ? seconds : 300); /* never hang: SIGALRM ends the process */
	const char *host = optind < argc ? argv[optind] : NULL;
	open_endpoint(prov, dom);
	int fd = oob_connect(host, port);
	exchange_addresses(fd);
	if (host) run_client();
	else run_server();
	/* Both sides finish before either closes its endpoint. */
	char done = 'x';
	if (write(fd, &done, 1) != 1 || read(fd, &done, 1) != 1) fprintf(stderr, "fi_bw: peer left early\n");
	close(fd);
	fi_close(&ep->fid);
	if (tx_mr) fi_close(&tx_mr->fid);
	if (rx_mr) fi_close(&rx_mr->fid);
	fi_close(&av->fid);
	fi_close(&cq->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	return 0;
}
