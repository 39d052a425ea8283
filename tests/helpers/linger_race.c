// Hostile program for the process backend's tests (tests/integration/process/network_test.cpp):
// tries to make the host hold the last reference to a lingering TCP socket.
//
// The host copies a socket (pidfd_getfd) to read its type when the program tries egress. If
// the program drops every reference of its own in that moment, the host's copy is the last;
// a socket set to linger with unsent data its peer never reads then blocks that last close
// for the linger time. Each attempt: a loopback connection whose send buffer is full and
// whose peer does not read, SO_LINGER {1, 10^6 s}, a child that holds the only reference,
// connects to a non-loopback address (notified to the host) and has a second thread
// exit_group() the child after a random delay around the notification's round trip.
//
// Prints "hit" each time the host was left holding the socket (after the program closed it,
// /proc/net/tcp still lists it with an inode: a file still refers to it), "stalled" if the
// host stopped answering notifications (a probe connect unanswered for 1 s), and "attempts N"
// every 10 attempts. Runs until killed. Build: cc -O2 -static -pthread.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static struct sockaddr_in remote_addr;
static volatile int started;
static long long exit_delay_ns;

static void* exit_later(void* unused) {
  (void)unused;
  while (!started) {
  }
  long long t0 = now_ns();
  while (now_ns() - t0 < exit_delay_ns) {
  }
  syscall(SYS_exit_group, 0);
  return NULL;
}

static void on_alarm(int sig) { (void)sig; }

// True when /proc/net/tcp lists local port `port` with a nonzero inode (a file refers to it).
static int still_referenced(unsigned port) {
  FILE* f = fopen("/proc/net/tcp", "r");
  if (!f) return 0;
  char line[512];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned lport = 0;
    unsigned long inode = 0;
    if (sscanf(line, " %*d: %*8X:%X %*8X:%*X %*X %*X:%*X %*X:%*X %*X %*u %*u %lu", &lport,
               &inode) == 2 &&
        lport == port && inode != 0) {
      found = 1;
    }
  }
  fclose(f);
  return found;
}

int main(void) {
  remote_addr.sin_family = AF_INET;
  remote_addr.sin_port = htons(80);
  inet_pton(AF_INET, "192.0.2.1", &remote_addr.sin_addr);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);

  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in local;
  memset(&local, 0, sizeof local);
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t llen = sizeof local;
  if (bind(listener, (struct sockaddr*)&local, sizeof local) || listen(listener, 64) ||
      getsockname(listener, (struct sockaddr*)&local, &llen)) {
    perror("listen");
    return 1;
  }
  // The notification's round trip, to aim the child's exit at it.
  long long total = 0;
  for (int i = 0; i < 40; ++i) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    long long t0 = now_ns();
    connect(s, (struct sockaddr*)&remote_addr, sizeof remote_addr);
    total += now_ns() - t0;
    close(s);
  }
  const long long round_trip = total / 40;
  srand((unsigned)getpid());
  int peers[64];
  int npeers = 0;
  for (long attempt = 1;; ++attempt) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    if (connect(c, (struct sockaddr*)&local, sizeof local)) return 1;
    struct sockaddr_in mine;
    socklen_t mlen = sizeof mine;
    getsockname(c, (struct sockaddr*)&mine, &mlen);
    int peer = accept(listener, NULL, NULL);
    setsockopt(peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    fcntl(c, F_SETFL, O_NONBLOCK);
    char buf[4096];
    memset(buf, 'x', sizeof buf);
    while (send(c, buf, sizeof buf, 0) > 0) {
    }
    fcntl(c, F_SETFL, 0);
    struct linger lg = {1, 1000000};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    exit_delay_ns = (long long)((double)rand() / RAND_MAX * 1.3 * (double)round_trip);
    pid_t child = fork();
    if (child == 0) {
      pthread_t t;
      pthread_create(&t, NULL, exit_later, NULL);
      started = 1;
      connect(c, (struct sockaddr*)&remote_addr, sizeof remote_addr);
      for (;;) pause();
    }
    close(c);
    waitpid(child, NULL, 0);
    if (still_referenced(ntohs(mine.sin_port))) {
      printf("hit\n");
      fflush(stdout);
    }
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    alarm(1);
    int r = connect(probe, (struct sockaddr*)&remote_addr, sizeof remote_addr);
    int e = errno;
    alarm(0);
    close(probe);
    if (r < 0 && e == EINTR) {
      printf("stalled\n");
      fflush(stdout);
      for (;;) pause();
    }
    peers[npeers++] = peer;  // unread: keeps the lingering side waiting
    if (npeers == 64) {
      for (int i = 0; i < 64; ++i) close(peers[i]);
      npeers = 0;
    }
    if (attempt % 10 == 0) {
      printf("attempts %ld\n", attempt);
      fflush(stdout);
    }
  }
}
