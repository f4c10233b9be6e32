/* Syscall storm for bench/ingest.py: getppid() in a loop at a given rate.
 *
 *   storm RATE SECONDS [THREADS] [BATCH]
 *
 * RATE is syscalls/s over all threads (0: as fast as possible). Prints
 * "ready <tgid> <syscall nr>", waits for a line on stdin (the tracer is
 * attached by then), storms, then prints "done <syscalls> <seconds>".
 * Rate limiting: after each batch, sleep until the time that batch was due
 * (absolute deadlines, so sleep jitter does not accumulate).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double rate_per_thread;
static double seconds;
static long batch = 512;
static struct timespec start;

static double since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now); /* vDSO: no syscall */
	return (now.tv_sec - t0->tv_sec) + (now.tv_nsec - t0->tv_nsec) / 1e9;
}

static void *storm(void *arg)
{
	long *count = arg;
	long n = 0;

	for (;;) {
		for (long i = 0; i < batch; i++)
			syscall(SYS_getppid);
		n += batch;
		double t = since(&start);
		if (t >= seconds)
			break;
		if (rate_per_thread > 0) {
			double due = n / rate_per_thread; /* when this batch was due */
			if (due > t) {
				struct timespec at = start;
				long long ns = start.tv_nsec + (long long)(due * 1e9);
				at.tv_sec += ns / 1000000000LL;
				at.tv_nsec = ns % 1000000000LL;
				clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
			}
		}
	}
	*count = n;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s RATE SECONDS [THREADS] [BATCH]\n", argv[0]);
		return 2;
	}
	double rate = atof(argv[1]);
	int threads = argc > 3 ? atoi(argv[3]) : 1;
	char line[64];
	pthread_t tid[64];
	long counts[64] = {0};
	long total = 0;

	seconds = atof(argv[2]);
	if (argc > 4)
		batch = atol(argv[4]);
	if (threads < 1 || threads > 64 || batch < 1) {
		fprintf(stderr, "threads must be 1..64 and batch >= 1\n");
		return 2;
	}
	rate_per_thread = rate / threads;
	printf("ready %d %d\n", getpid(), SYS_getppid);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 1; i < threads; i++)
		pthread_create(&tid[i], NULL, storm, &counts[i]);
	storm(&counts[0]);
	for (int i = 1; i < threads; i++)
		pthread_join(tid[i], NULL);
	double elapsed = since(&start);
	for (int i = 0; i < threads; i++)
		total += counts[i];
	printf("done %ld %.6f\n", total, elapsed);
	return 0;
}
