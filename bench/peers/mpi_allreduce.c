/*
 * Open MPI allreduce benchmark, output-compatible with `gorovod bench` and
 * gloo_allreduce.py.
 *
 * For every message size: float32 MPI_SUM MPI_Allreduce (out of place, like
 * gorovod's benchmark), --warmup untimed runs, then --iters samples, each
 * started by MPI_Barrier and timed with MPI_Wtime on every rank. A sample lasts
 * as long as its slowest rank (MPI_Reduce MPI_MAX of the per-rank time array at
 * the end of the size); the MEDIAN over samples is reported by rank 0 as one
 * JSON line:
 *   {"impl":"mpi-tcp","op":"allreduce","np":N,"bytes":B,"time_us":T,
 *    "algbw_gbps":..,"busbw_gbps":..,"correct":true,...}
 * algbw = bytes/time (GB/s, 1e9 B/s), busbw = algbw*2*(np-1)/np.
 * --batch-time-us B (default 0 = off): if one op is shorter than B, a sample
 * runs B/op+1 ops back to back (max 1000, MAX over ranks) and reports the
 * per-op time: gorovod's rule (its default there is 1000 us).
 *
 * Element i of rank r is (r+i)%4, so the sum is exact; the result of the last
 * run is checked on every rank (MIN over ranks -> "correct").
 *
 * The transport is chosen on the mpirun command line (see run.sh); --impl only
 * names it in the output.
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 */
#include <mpi.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char *s) {
    char buf[64];
    size_t n = 0;
    for (; *s && n < sizeof buf - 1; s++)
        if (!isspace((unsigned char)*s)) buf[n++] = (char)toupper((unsigned char)*s);
    buf[n] = 0;
    if (n >= 3 && strcmp(buf + n - 2, "IB") == 0) buf[n -= 2] = 0;
    else if (n >= 2 && buf[n - 1] == 'B') buf[--n] = 0;
    long long mult = 1;
    if (n > 0 && strchr("KMG", buf[n - 1])) {
        mult = buf[n - 1] == 'K' ? 1LL << 10 : buf[n - 1] == 'M' ? 1LL << 20 : 1LL << 30;
        buf[--n] = 0;
    }
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (n == 0 || *end || v < 0) {
        fprintf(stderr, "mpi_allreduce: bad size %s\n", s);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return v * mult;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void) {
    fprintf(stderr,
            "usage: mpirun ... mpi_allreduce [--impl NAME] [--min-bytes 4K] [--max-bytes 64M]\n"
            "       [--factor 2] [--sizes 4K,256K,...] [--warmup 5] [--iters 20] [--batch-time-us 0]\n");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);

    const char *impl = "mpi", *minb = "4K", *maxb = "64M", *sizes_arg = NULL;
    long long factor = 2;
    int warmup = 5, iters = 20;
    double batch_time_us = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { if (rank == 0) usage(); MPI_Abort(MPI_COMM_WORLD, 2); }
        if (!strcmp(a, "--impl")) impl = v;
        else if (!strcmp(a, "--min-bytes")) minb = v;
        else if (!strcmp(a, "--max-bytes")) maxb = v;
        else if (!strcmp(a, "--factor")) factor = atoll(v);
        else if (!strcmp(a, "--sizes")) sizes_arg = v;
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--batch-time-us")) batch_time_us = atof(v);
        else { if (rank == 0) { fprintf(stderr, "mpi_allreduce: unknown flag %s\n", a); usage(); } MPI_Abort(MPI_COMM_WORLD, 2); }
        i++;
    }
    if (iters < 1 || warmup < 0) { if (rank == 0) usage(); MPI_Abort(MPI_COMM_WORLD, 2); }
    if (factor < 2) factor = 2;

    long long sizes[256];
    int nsizes = 0;
    if (sizes_arg && *sizes_arg) {
        char *copy = strdup(sizes_arg), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t && nsizes < 256; t = strtok_r(NULL, ",", &save))
            sizes[nsizes++] = parse_size(t);
        free(copy);
    } else {
        long long lo = parse_size(minb), hi = parse_size(maxb);
        for (long long b = lo; b <= hi && nsizes < 256; b *= factor) {
            sizes[nsizes++] = b;
            if (b == 0) break;
        }
    }
    if (nsizes == 0) { if (rank == 0) fprintf(stderr, "mpi_allreduce: no sizes\n"); MPI_Abort(MPI_COMM_WORLD, 2); }

    double *samples = malloc(sizeof(double) * iters), *maxs = malloc(sizeof(double) * iters);
    for (int s = 0; s < nsizes; s++) {
        long long n = sizes[s] / 4, nbytes = n * 4;
        if (n > 0x7fffffffLL) { if (rank == 0) fprintf(stderr, "mpi_allreduce: size too large\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
        float *send = malloc(nbytes ? nbytes : 4), *recv = malloc(nbytes ? nbytes : 4);
        if (!send || !recv) { fprintf(stderr, "mpi_allreduce: out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 3); }
        for (long long i = 0; i < n; i++) send[i] = (float)((rank + i) % 4);
        memset(recv, 0, nbytes);

        double warm = 0;
        for (int w = 0; w < (warmup > 0 ? warmup : 1); w++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            warm = MPI_Wtime() - t0;
        }
        long long batch = 1;
        double bt = batch_time_us * 1e-6;
        if (bt > 0 && warm > 0 && warm < bt) {
            batch = (long long)(bt / warm) + 1;
            if (batch > 1000) batch = 1000;
        }
        MPI_Allreduce(MPI_IN_PLACE, &batch, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);

        for (int it = 0; it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long long b = 0; b < batch; b++)
                MPI_Allreduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            samples[it] = (MPI_Wtime() - t0) / (double)batch;
        }
        MPI_Reduce(samples, maxs, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

        int ok = 1;
        for (long long i = 0; i < n && ok; i++) {
            double want = 0;
            for (int r = 0; r < p; r++) want += (double)((r + i) % 4);
            if ((double)recv[i] != want) ok = 0;
        }
        int all_ok = 0;
        MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, 0, MPI_COMM_WORLD);

        if (rank == 0) {
            qsort(maxs, iters, sizeof(double), cmp_double);
            double med = iters % 2 ? maxs[iters / 2] : (maxs[iters / 2 - 1] + maxs[iters / 2]) / 2;
            double algbw = med > 0 ? (double)nbytes / med / 1e9 : 0;
            double busbw = algbw * 2.0 * (p - 1) / p;
            printf("{\"impl\": \"%s\", \"op\": \"allreduce\", \"np\": %d, \"bytes\": %lld, \"count\": %lld, "
                   "\"dtype\": \"float32\", \"redop\": \"sum\", \"time_us\": %.3f, \"algbw_gbps\": %.6f, "
                   "\"busbw_gbps\": %.6f, \"correct\": %s, \"iters\": %d, \"batch\": %lld}\n",
                   impl, p, nbytes, n, med * 1e6, algbw, busbw, all_ok ? "true" : "false", iters, batch);
            fflush(stdout);
        }
        free(send);
        free(recv);
    }
    free(samples);
    free(maxs);
    MPI_Finalize();
    return 0;
}
