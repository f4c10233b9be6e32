/* Context-switch storm: PAIRS pairs of processes ping-ponging one byte through
 * two pipes for SECONDS seconds (like hackbench -p / stress-ng --switch).
 *
 *   storm PAIRS SECONDS
 *
 * Each pair: the pinger writes a byte to pipe A and blocks reading pipe B; the
 * ponger blocks reading A and answers on B. Every message wakes a blocked
 * process, so every message is at least one context switch on each side's CPU.
 * Prints one JSON line: round trips (and per second), messages per second, and
 * the machine's context switches per second over the run (/proc/stat ctxt).
 * Built with gcc -O2 -static (no libc needed where it runs):
 *
 *   gcc -O2 -static -o storm bench/switch_storm.c
 *
 * the storm of `python -m bench overhead --storm` and `storm-tree --storm` on
 * machines without stress-ng, or with more CPUs than stress-ng's pairs fill.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAIRS 1024

struct shared {
	volatile int go;
	volatile int stop;
	volatile long counts[MAX_PAIRS];
};

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned long long ctxt(void)
{
	char line[256];
	unsigned long long v = 0;
	FILE *f = fopen("/proc/stat", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "ctxt %llu", &v) == 1)
			break;
	fclose(f);
	return v;
}

static int xread(int fd, char *c)
{
	for (;;) {
		ssize_t n = read(fd, c, 1);
		if (n == 1)
			return 1;
		if (n < 0 && errno == EINTR)
			continue;
		return 0;
	}
}

static int xwrite(int fd, const char *c)
{
	for (;;) {
		ssize_t n = write(fd, c, 1);
		if (n == 1)
			return 1;
		if (n < 0 && errno == EINTR)
			continue;
		return 0;
	}
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s PAIRS SECONDS\n", argv[0]);
		return 2;
	}
	int pairs = atoi(argv[1]);
	double seconds = atof(argv[2]);
	if (pairs < 1 || pairs > MAX_PAIRS || seconds <= 0) {
		fprintf(stderr, "PAIRS must be 1..%d and SECONDS > 0\n", MAX_PAIRS);
		return 2;
	}
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset((void *)sh, 0, sizeof(*sh));
	cpu_set_t set;
	int cpus = 0;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		cpus = CPU_COUNT(&set);
	signal(SIGPIPE, SIG_IGN);
	pid_t parent = getpid();
	pid_t *kids = calloc(2 * pairs, sizeof(pid_t));
	for (int i = 0; i < pairs; i++) {
		int a[2], b[2];
		if (pipe(a) || pipe(b)) {
			perror("pipe");
			return 1;
		}
		for (int role = 0; role < 2; role++) {
			pid_t pid = fork();
			if (pid < 0) {
				perror("fork");
				sh->stop = 1;
				return 1;
			}
			if (pid == 0) {
				char c = 'x';
				long n = 0;
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				if (getppid() != parent)
					_exit(1);
				if (role == 0) { /* pinger */
					close(a[0]);
					close(b[1]);
					while (!sh->go && !sh->stop)
						usleep(1000);
					while (!sh->stop) {
						if (!xwrite(a[1], &c) || !xread(b[0], &c))
							break;
						n++;
					}
					sh->counts[i] = n;
					close(a[1]); /* the ponger reads EOF and exits */
					_exit(0);
				}
				close(a[1]); /* ponger */
				close(b[0]);
				while (xread(a[0], &c))
					if (!xwrite(b[1], &c))
						break;
				_exit(0);
			}
			kids[2 * i + role] = pid;
		}
		close(a[0]);
		close(a[1]);
		close(b[0]);
		close(b[1]);
	}
	usleep(100000); /* every child is at its start line */
	unsigned long long c0 = ctxt();
	double t0 = now_s();
	sh->go = 1;
	struct timespec due;
	clock_gettime(CLOCK_MONOTONIC, &due);
	long long ns = due.tv_nsec + (long long)(seconds * 1e9);
	due.tv_sec += ns / 1000000000LL;
	due.tv_nsec = ns % 1000000000LL;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR)
		;
	sh->stop = 1;
	double elapsed = now_s() - t0;
	unsigned long long c1 = ctxt();
	int failed = 0;
	for (int i = 0; i < 2 * pairs; i++) {
		int st = 0;
		if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed++;
	}
	long total = 0;
	for (int i = 0; i < pairs; i++)
		total += sh->counts[i];
	printf("{\"pairs\": %d, \"cpus\": %d, \"seconds\": %.6f, \"round_trips\": %ld, "
	       "\"round_trips_per_s\": %.1f, \"messages_per_s\": %.1f, \"ctxt\": %llu, "
	       "\"ctxt_per_s\": %.1f, \"failed_children\": %d}\n",
	       pairs, cpus, elapsed, total, total / elapsed, 2.0 * total / elapsed,
	       c1 - c0, (c1 - c0) / elapsed, failed);
	fflush(stdout);
	return failed ? 1 : 0;
}
