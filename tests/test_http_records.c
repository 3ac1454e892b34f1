/* test_http_records.c: the HTTP door's own per-address records (failed bearer
 * tokens) are swept as the daemon's are - on a virtual clock, the door in-process. */
#include <stdio.h>
#include <string.h>

#include "server/http_impl.h"
#include "daemon_util.h"
#include "testutil.h"

int main(void) {
    dj__token tk;
    memset(&tk, 0, sizeof tk);
    memcpy(tk.secret, "right-token", 11);
    tk.len = 11;
    tk.qos_mask = 6;
    const dj__http_cfg cfg = {.addr = "127.0.0.1:0", .models = DJ_SOURCE_DIR "/models", .auth = &tk, .n_auth = 1,
                              .max_conns = 8, .max_body = 4096, .timeout_s = 10, .header_s = 10, .body_s = 10,
                              .per_addr = 8, .unauth = 8};
    dj__http *h = NULL;
    CHECK_OK(dj__http_start(&cfg, &h));
    if (!h) return dj_test_finish("test_http_records");
    const unsigned port = dj__http_port(h);
    CHECK(port > 0);
    CHECK(dj__http_sweep(h, 0) == 0);
    /* two wrong tokens from 127.0.0.1: one record (the second waits its 100 ms turn) */
    for (int i = 0; i < 2; i++) {
        dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL);
        CHECK_MSG(r.status == 401, "a wrong token: %d", r.status);
        dj_test_resp_free(&r);
    }
    const uint64_t t = dj__now_ms();
    CHECK_MSG(dj__http_sweep(h, 0) == 1, "%zu records after 127.0.0.1's wrong tokens", dj__http_sweep(h, 0));
    /* a young record stays; one quiet for DJ__PEER_FORGET_MS goes */
    CHECK(dj__http_sweep(h, t + 1000) == 1);
    CHECK(dj__http_sweep(h, t + DJ__PEER_FORGET_MS - 10000) == 1);
    CHECK(dj__http_sweep(h, t + DJ__PEER_FORGET_MS + 10000) == 0);
    /* the address starts afresh: a wrong token is recorded again, a right one clears it (the
     * request itself then gets 503: there is no daemon behind this door - .srv NULL) */
    dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL);
    CHECK(r.status == 401);
    dj_test_resp_free(&r);
    CHECK(dj__http_sweep(h, 0) == 1);
    r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: Bearer right-token\r\n", NULL);
    CHECK_MSG(r.status != 401, "the right token: %d", r.status);
    dj_test_resp_free(&r);
    CHECK(dj__http_sweep(h, 0) == 0);
    r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL);
    CHECK(r.status == 401);
    dj_test_resp_free(&r);
    CHECK(dj__http_sweep(h, 0) == 1);
    dj__http_stop(h);
    return dj_test_finish("test_http_records");
}
