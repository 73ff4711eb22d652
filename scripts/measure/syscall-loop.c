// ns per getppid() syscall, by thread CPU time, best of R rounds of N calls
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int c,char**v){long n=c>1?atol(v[1]):2000000;int r=c>2?atoi(v[2]):5;double best=1e18,sum=0;
for(int k=0;k<r;k++){double a=now();for(long i=0;i<n;i++)syscall(SYS_getppid);double d=(now()-a)/n;sum+=d;if(d<best)best=d;}
printf("best %.1f mean %.1f ns/syscall\n",best,sum/r);return 0;}
