// ns per futex call, by thread CPU time: FUTEX_WAIT on a word whose value
// differs (returns EAGAIN at once: the tracer's whole wait path, entry and
// exit) alternating with FUTEX_WAKE with no waiter (its wake path).
// Waits for a start file, so a tracer can attach first, and after printing
// for an end file, so the tracer's figures can be read before it sees the
// exit and stops: futex-loop N ROUNDS [STARTFILE ENDFILE]
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec*1e9+t.tv_nsec;}
static unsigned word = 0;
int main(int c, char **v) {
  long n = c > 1 ? atol(v[1]) : 1000000; int r = c > 2 ? atoi(v[2]) : 5;
  if (c > 3) while (access(v[3], F_OK) != 0) usleep(10000);
  double best = 1e18, sum = 0;
  for (int k = 0; k < r; k++) {
    double a = now();
    for (long i = 0; i < n; i++) {
      syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
      syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
    double d = (now() - a) / (2.0 * n); sum += d; if (d < best) best = d;
  }
  printf("best %.1f mean %.1f ns/futex call\n", best, sum / r);
  fflush(stdout);
  if (c > 4) while (access(v[4], F_OK) != 0) usleep(10000);
  return 0;
}
