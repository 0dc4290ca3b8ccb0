/* Tests of the NNG pagoda links (scripts/nng.patch, fix 3): closing a socket while a message
 * larger than the kernel's socket buffer is still on its way must return.
 *
 * NNG 1.5.2 sends such a message in several writes, each write's callback sending the rest on
 * the same aio. A close that stops that aio while one of those callbacks is on its way loses the
 * transfer's completion, and nng_close then waits for it forever (test_router's 5 MiB message
 * hung there in the ASan suite). The receiving side does the same with a message read in parts.
 * Each case below closes sockets at random points of 4 MiB transfers, over ipc:// and tcp://;
 * with the unpatched library the send cases hang within a few closes (the receive case over
 * ipc at the first). A round (dial, send, close) that has not ended after CLOSE_LIMIT_S seconds
 * fails the test at once (SIGALRM) rather than leaving it to CTest's timeout. A pass shows that
 * no close hung in these rounds, not that every round hit the window. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* Larger than a unix or loopback TCP socket's buffer, so every transfer takes many writes. */
#define MESSAGE_BYTES (4u << 20)
/* Closes per case and transport: with the unpatched library the send cases hung within 25. */
#define CLOSES 100
/* A round is given this long (an ASan build included) before the test calls it hung. */
#define CLOSE_LIMIT_S 20
/* A close comes this many microseconds after the send, at most (a 4 MiB transfer takes ~1-5 ms
 * here), so closes land before, during and after transfers. */
#define CLOSE_DELAY_MAX_US 4000

static const char *case_name = "";
static int case_close;

static void on_alarm(int sig)
{
    (void)sig;
    char msg[160];
    int n = snprintf(msg, sizeof(msg),
                     "test_nng_close: %s: round %d did not end in %d s (NNG without "
                     "scripts/nng.patch fix 3?)\n",
                     case_name, case_close, CLOSE_LIMIT_S);
    if (n > 0)
        (void)!write(STDERR_FILENO, msg, (size_t)n);
    _exit(1);
}

static uint64_t rng_state;

static unsigned delay_us(void)
{
    /* xorshift64 from a random seed: each run closes at other points. */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % CLOSE_DELAY_MAX_US);
}

struct endpoint {
    char url[128];
    char dir[64];
};

/* A REP socket listening on a fresh ipc:// path or on a loopback port the kernel picks; url is
 * where to dial it. */
static nng_socket listen_rep(int tcp, struct endpoint *ep)
{
    nng_socket rep;
    assert_int_equal(nng_rep0_open(&rep), 0);
    /* No size limit: the receiver reads at full speed, which makes the sender's writes
     * partial again and again. */
    assert_int_equal(nng_socket_set_size(rep, NNG_OPT_RECVMAXSZ, 0), 0);
    nng_listener l;
    if (tcp) {
        assert_int_equal(nng_listen(rep, "tcp://127.0.0.1:0", &l, 0), 0);
        nng_sockaddr sa;
        assert_int_equal(nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa), 0);
        assert_int_equal(sa.s_family, NNG_AF_INET);
        snprintf(ep->url, sizeof(ep->url), "tcp://127.0.0.1:%u", ntohs(sa.s_in.sa_port));
    } else {
        if (ep->dir[0] == '\0') {
            snprintf(ep->dir, sizeof(ep->dir), "/tmp/pagoda-nngclose-XXXXXX");
            assert_non_null(mkdtemp(ep->dir));
        }
        snprintf(ep->url, sizeof(ep->url), "ipc://%s/rep.ipc", ep->dir);
        assert_int_equal(nng_listen(rep, ep->url, &l, 0), 0);
    }
    return rep;
}

static void endpoint_done(struct endpoint *ep)
{
    if (ep->dir[0] != '\0') {
        char path[128];
        snprintf(path, sizeof(path), "%s/rep.ipc", ep->dir);
        unlink(path);
        rmdir(ep->dir);
    }
}

static nng_socket dial_req(const char *url)
{
    nng_socket req;
    assert_int_equal(nng_req0_open(&req), 0);
    /* No resend: a request whose pipe closed is not sent again behind the test's back. */
    assert_int_equal(nng_socket_set_ms(req, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE), 0);
    assert_int_equal(nng_dial(req, url, NULL, 0), 0);
    return req;
}

/* The sender closes: one listener, a REQ socket per close that sends 4 MiB and closes. */
static void sender_closes(int tcp)
{
    case_name = tcp ? "sender closes, tcp" : "sender closes, ipc";
    struct endpoint ep = {0};
    nng_socket rep = listen_rep(tcp, &ep);
    uint8_t *body = calloc(1, MESSAGE_BYTES);
    assert_non_null(body);
    for (case_close = 0; case_close < CLOSES; case_close++) {
        alarm(CLOSE_LIMIT_S);
        nng_socket req = dial_req(ep.url);
        assert_int_equal(nng_send(req, body, MESSAGE_BYTES, 0), 0);
        usleep(delay_us());
        assert_int_equal(nng_close(req), 0);
        alarm(0);
    }
    free(body);
    alarm(CLOSE_LIMIT_S);
    assert_int_equal(nng_close(rep), 0);
    alarm(0);
    endpoint_done(&ep);
}

/* The receiver closes: a listener per close, whose socket closes while it reads a 4 MiB
 * message; then the sender's socket closes too. */
static void receiver_closes(int tcp)
{
    case_name = tcp ? "receiver closes, tcp" : "receiver closes, ipc";
    struct endpoint ep = {0};
    uint8_t *body = calloc(1, MESSAGE_BYTES);
    assert_non_null(body);
    for (case_close = 0; case_close < CLOSES; case_close++) {
        alarm(CLOSE_LIMIT_S);
        nng_socket rep = listen_rep(tcp, &ep);
        nng_socket req = dial_req(ep.url);
        assert_int_equal(nng_send(req, body, MESSAGE_BYTES, 0), 0);
        usleep(delay_us());
        assert_int_equal(nng_close(rep), 0);
        assert_int_equal(nng_close(req), 0);
        alarm(0);
    }
    free(body);
    endpoint_done(&ep);
}

static void test_sender_closes_ipc(void **state)
{
    (void)state;
    sender_closes(0);
}

static void test_sender_closes_tcp(void **state)
{
    (void)state;
    sender_closes(1);
}

static void test_receiver_closes_ipc(void **state)
{
    (void)state;
    receiver_closes(0);
}

static void test_receiver_closes_tcp(void **state)
{
    (void)state;
    receiver_closes(1);
}

int main(void)
{
    if (getrandom(&rng_state, sizeof(rng_state), 0) != sizeof(rng_state) || rng_state == 0)
        rng_state = 0x9e3779b97f4a7c15ull;
    signal(SIGALRM, on_alarm);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sender_closes_ipc),
        cmocka_unit_test(test_sender_closes_tcp),
        cmocka_unit_test(test_receiver_closes_ipc),
        cmocka_unit_test(test_receiver_closes_tcp),
    };
    int failed = cmocka_run_group_tests_name("nng close", tests, NULL, NULL);
    nng_fini();
    return failed;
}
