/* test_agent_check.c: the weight and reply djinnd's --agent-check gives HAProxy
 * (src/server/agent_check.c), and the listener answering a real connection. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/agent_check.h"
#include "server/server_impl.h"
#include "testutil.h"

static const char *reply_of(const dj__agent_load *in) {
    static char buf[64];
    const size_t n = dj__agent_reply(in, buf, sizeof buf);
    CHECK(n == strlen(buf));
    return buf;
}

static void test_weight(void) {
    dj__agent_load in = {.pages_total = 0}; /* nothing published yet: all room */
    CHECK(dj__agent_weight(&in) == 100);
    CHECK(!strcmp(reply_of(&in), "up 100%\n"));
    in.pages_total = 1000, in.pages_free = 730;
    CHECK(dj__agent_weight(&in) == 73);
    CHECK(!strcmp(reply_of(&in), "up 73%\n"));
    in.waiting = 4; /* four queued requests halve it */
    CHECK_MSG(dj__agent_weight(&in) == 37, "weight %d", dj__agent_weight(&in));
    in.waiting = 0, in.step_ms = 20, in.step_best_ms = 10; /* steps twice as slow halve it */
    CHECK_MSG(dj__agent_weight(&in) == 37, "weight %d", dj__agent_weight(&in));
    in.step_ms = 5; /* faster than the best seen: no bonus */
    CHECK(dj__agent_weight(&in) == 73);
    in.step_ms = 0, in.step_best_ms = 0; /* no step in the interval */
    CHECK(dj__agent_weight(&in) == 73);
    in.pages_free = 1; /* a page free: at least 1 */
    CHECK(dj__agent_weight(&in) == 1);
    in.pages_free = 0; /* none: only sticky sessions come */
    CHECK(dj__agent_weight(&in) == 0);
    CHECK(!strcmp(reply_of(&in), "up 0%\n"));
    in.pages_free = 5000; /* more free than total (a torn snapshot) never exceeds 100 */
    CHECK(dj__agent_weight(&in) == 100);
    in.waiting = UINT64_MAX, in.pages_free = 1000;
    CHECK(dj__agent_weight(&in) == 1);
    in.state_only = 1; /* agent-send "state": the load does not move the weight */
    CHECK(dj__agent_weight(&in) == 100);
    in.admin = DJ__AGENT_DRAIN;
    CHECK(!strcmp(reply_of(&in), "drain\n"));
}

static void test_words(void) {
    dj__agent_load in = {.admin = DJ__AGENT_DRAIN, .pages_total = 10, .pages_free = 10};
    CHECK(!strcmp(reply_of(&in), "drain\n"));
    in.admin = DJ__AGENT_MAINT;
    CHECK(!strcmp(reply_of(&in), "maint\n"));
    in.admin = DJ__AGENT_UP, in.ready = 1;
    CHECK(!strcmp(reply_of(&in), "up ready 100%\n"));
    char small[4];
    CHECK(dj__agent_reply(&in, small, sizeof small) == 3 && !strcmp(small, "up "));
}

/* One agent-check connection to 127.0.0.1:port (sending send first, if not NULL): the line it answers. */
static void ask_saying(int port, const char *send_first, char *out, size_t cap) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    if (send_first) CHECK(write(fd, send_first, strlen(send_first)) == (ssize_t)strlen(send_first));
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(fd);
}

static void ask(int port, char *out, size_t cap) { ask_saying(port, NULL, out, cap); }

static int free_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void test_listener(void) {
    dj__metrics m;
    memset(&m, 0, sizeof m);
    pthread_mutex_init(&m.mu, NULL);
    m.vmu.pages_total = 200, m.vmu.pages_free = 100, m.waiting = 4;
    const int port = free_port();
    char addr[64], line[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    dj__agent *a = NULL;
    CHECK(dj__agent_start(addr, &m, &a) == DJ_OK && a);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "up 25%\n"), "got '%s'", line);
    ask_saying(port, "state\n", line, sizeof line); /* a consistent-hash backend's check */
    CHECK_MSG(!strcmp(line, "up 100%\n"), "got '%s'", line);
    /* step time: 10 steps of 10 ms, then 10 of 40 ms - the weight falls to a quarter */
    pthread_mutex_lock(&m.mu);
    m.waiting = 0, m.gen_steps = 10, m.gen_step_s = 0.1;
    pthread_mutex_unlock(&m.mu);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "up 50%\n"), "got '%s'", line);
    pthread_mutex_lock(&m.mu);
    m.gen_steps = 20, m.gen_step_s = 0.5;
    pthread_mutex_unlock(&m.mu);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "up 13%\n"), "got '%s'", line);
    raise(SIGUSR1);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "drain\n"), "got '%s'", line);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "drain\n"), "got '%s'", line);
    raise(SIGUSR2); /* "ready", cancelling the drain it asked for - to every backend's check */
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "up ready 50%\n"), "got '%s'", line);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "up ready 50%\n"), "got '%s'", line);
    raise(SIGUSR2); /* not draining: nothing to cancel, the window stays as it was */
    raise(SIGUSR1); /* a drain ends the window at once */
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "drain\n"), "got '%s'", line);
    dj__agent_set_stopping(a);
    ask(port, line, sizeof line);
    CHECK_MSG(!strcmp(line, "maint\n"), "got '%s'", line);
    dj__agent *b = NULL; /* the port is taken: a clear error */
    CHECK(dj__agent_start(addr, &m, &b) == DJ_EIO && !b);
    CHECK(dj__agent_start("unix:/tmp/x", &m, &b) == DJ_EINVAL && !b);
    dj__agent_stop(a);
    dj__agent_stop(NULL);
    pthread_mutex_destroy(&m.mu);
}

int main(void) {
    dj_test_seeds();
    test_weight();
    test_words();
    test_listener();
    return dj_test_finish("test_agent_check");
}
