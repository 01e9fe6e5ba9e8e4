/*
 * The MPI peer of the event-builder benchmark: N ranks exchange a block of
 * BLOCK bytes with every other rank with MPI_Alltoall, again and again, for
 * SECONDS. Like evb, which builds events from fresh data, every iteration
 * writes new bytes into the send buffer and reads the received ones (a
 * checksum that the compiler cannot drop), so no cached buffer is sent
 * twice for free.
 *
 * Prints one parseable line on rank 0:
 *   alltoall ranks=4 block=1048576 seconds=5.00 iterations=... gbps=...
 * gbps counts the bytes received from OTHER ranks, summed over all ranks;
 * gbps_with_local also counts each rank's block to itself, which is what
 * evb's built-event throughput counts (an event holds every fragment,
 * the folded node's own included): bench/evb-vs-mpi-alltoall.sh compares
 * the two like for like.
 *
 * PEER_HUGEPAGES=1 puts both buffers on transparent huge pages.
 *
 * Build: mpicc -O2 -o mpi_alltoall mpi_alltoall.c
 * Run:   mpirun -np 4 ./mpi_alltoall BLOCK SECONDS
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* PEER_HUGEPAGES=1: the buffers on transparent huge pages, as evb's
 * (event_builder.huge_pages), to compare on equal pages; otherwise malloc,
 * as an MPI program usually allocates. */
static void *alloc_buffer(size_t bytes)
{
    const char *huge = getenv("PEER_HUGEPAGES");
    if (!huge || strcmp(huge, "1") != 0)
        return malloc(bytes);
    size_t two_mib = (size_t)2 << 20;
    size_t rounded = (bytes + two_mib - 1) / two_mib * two_mib;
    void *p = NULL;
    if (posix_memalign(&p, two_mib, rounded) != 0)
        return NULL;
    madvise(p, rounded, MADV_HUGEPAGE);
    return p;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t block = argc > 1 ? strtoull(argv[1], NULL, 10) : (1u << 20);
    double seconds = argc > 2 ? atof(argv[2]) : 5.0;
    if (block == 0 || block % 8 != 0) {
        if (rank == 0)
            fprintf(stderr, "block must be a positive multiple of 8 bytes\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    uint64_t *send = alloc_buffer(block * size);
    uint64_t *recv = alloc_buffer(block * size);
    if (!send || !recv) {
        fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", rank, 2 * block * size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t words = block * size / 8;
    memset(recv, 0, block * size);
    uint64_t sum = 0;
    long iterations = 0;
    int done = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    while (!done) {
        /* Fresh data: a pattern that changes every iteration. */
        uint64_t seed = ((uint64_t)rank << 40) ^ (uint64_t)iterations * 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < words; i++)
            send[i] = seed + i;
        MPI_Alltoall(send, (int)block, MPI_BYTE, recv, (int)block, MPI_BYTE, MPI_COMM_WORLD);
        /* Touch what arrived: one word per 64-byte line. */
        for (size_t i = 0; i < words; i += 8)
            sum += recv[i];
        iterations++;
        /* Everyone stops after the same iteration. */
        int over = MPI_Wtime() - t0 >= seconds;
        MPI_Allreduce(&over, &done, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    }
    double elapsed = MPI_Wtime() - t0;
    uint64_t total_sum = 0;
    MPI_Reduce(&sum, &total_sum, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double remote_bytes = (double)iterations * size * (size - 1) * block;
        double all_bytes = (double)iterations * size * size * block;
        printf("alltoall ranks=%d block=%zu seconds=%.2f iterations=%ld gbps=%.3f gbps_with_local=%.3f checksum=%llx\n",
               size, block, elapsed, iterations, remote_bytes * 8 / elapsed / 1e9,
               all_bytes * 8 / elapsed / 1e9, (unsigned long long)total_sum);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
