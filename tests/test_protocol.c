/* test_protocol.c: the frame header and metadata codec - round trips of
 * random headers and maps, and every malformed input answered by an error. */
#include <stdlib.h>
#include <string.h>

#include "proto/proto_impl.h"
#include "testutil.h"

static dj_frame_header rand_header(void) {
    dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = DJ_PROTO_VERSION};
    static const uint16_t types[] = {DJ_MSG_HELLO, DJ_MSG_GENERATE, DJ_MSG_FETCH, DJ_MSG_TOKEN, DJ_MSG_ERROR};
    h.type = types[dj_test_rand() % 5];
    h.meta_len = (uint32_t)(dj_test_rand() % (DJ_PROTO_MAX_META + 1));
    h.request_id = dj_test_rand();
    h.payload_len = dj_test_rand() % (DJ_PROTO_MAX_REQ_PAYLOAD + 1);
    return h;
}

static void test_header(void) {
    for (int i = 0; i < 1000; i++) {
        dj_frame_header h = rand_header(), g;
        uint8_t b[DJ_FRAME_HEADER_BYTES];
        dj_frame_header_encode(&h, b);
        CHECK_OK(dj_frame_header_decode(b, DJ_PROTO_MAX_REQ_PAYLOAD, &g));
        CHECK(g.type == h.type && g.meta_len == h.meta_len && g.request_id == h.request_id &&
              g.payload_len == h.payload_len);
    }
    /* little-endian layout, byte by byte */
    dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = 1, .type = DJ_MSG_STEP, .meta_len = 0x01020304,
                         .request_id = 0x1122334455667788ull, .payload_len = 0x0a0b};
    uint8_t b[DJ_FRAME_HEADER_BYTES], g8[DJ_FRAME_HEADER_BYTES];
    dj_frame_header_encode(&h, b);
    CHECK(!memcmp(b, "DJN1", 4) && b[4] == 1 && b[5] == 0 && b[6] == DJ_MSG_STEP && b[12] == 4 && b[15] == 1 &&
          b[16] == 0x88 && b[23] == 0x11 && b[24] == 0x0b && b[25] == 0x0a);
    dj_frame_header g;
    memcpy(g8, b, sizeof b);
    g8[0] = 'X';
    CHECK_ST(dj_frame_header_decode(g8, DJ_PROTO_MAX_REQ_PAYLOAD, &g), DJ_EFORMAT);
    memcpy(g8, b, sizeof b);
    g8[4] = 9;
    CHECK_ST(dj_frame_header_decode(g8, DJ_PROTO_MAX_REQ_PAYLOAD, &g), DJ_EUNSUPPORTED);
    memcpy(g8, b, sizeof b);
    g8[6] = 0x7f;
    CHECK_ST(dj_frame_header_decode(g8, DJ_PROTO_MAX_REQ_PAYLOAD, &g), DJ_EFORMAT);
    memcpy(g8, b, sizeof b);
    g8[9] = 1;
    CHECK_ST(dj_frame_header_decode(g8, DJ_PROTO_MAX_REQ_PAYLOAD, &g), DJ_EFORMAT);
    h.meta_len = DJ_PROTO_MAX_META + 1;
    dj_frame_header_encode(&h, b);
    CHECK_ST(dj_frame_header_decode(b, DJ_PROTO_MAX_REQ_PAYLOAD, &g), DJ_ERANGE);
    h.meta_len = 10;
    h.payload_len = DJ_PROTO_MAX_REQ_PAYLOAD + 1;
    dj_frame_header_encode(&h, b);
    CHECK_ST(dj_frame_header_decode(b, DJ_PROTO_MAX_REQ_PAYLOAD, &g), DJ_ERANGE);
    CHECK_OK(dj_frame_header_decode(b, DJ_PROTO_MAX_REPLY_PAYLOAD, &g));
    CHECK(!strcmp(dj_msg_type_name(DJ_MSG_GENERATE), "GENERATE") && !strcmp(dj_msg_type_name(0x7777), "?"));
    dj_qos q;
    CHECK_OK(dj_qos_parse("batch", &q));
    CHECK(q == DJ_QOS_BATCH);
    CHECK_ST(dj_qos_parse("urgent", &q), DJ_EINVAL);
}

static void test_meta_roundtrip(void) {
    for (int it = 0; it < 200; it++) {
        const uint64_t u = dj_test_rand();
        const int64_t i = -(int64_t)(dj_test_rand() >> 2);
        const double f = dj_test_randf(-1e3f, 1e3f);
        int32_t ids[40];
        const size_t n = dj_test_rand() % 40;
        for (size_t k = 0; k < n; k++) ids[k] = (int32_t)(dj_test_rand() % 100000);
        char str[32];
        snprintf(str, sizeof str, "s%llu", (unsigned long long)(dj_test_rand() % 1000));
        dj__mw w;
        dj__mw_init(&w);
        dj__mw_u64(&w, "u", u);
        dj__mw_i64(&w, "i", i);
        dj__mw_f64(&w, "f", f);
        dj__mw_bool(&w, "b", it & 1);
        dj__mw_str(&w, "s", str);
        dj__mw_ids(&w, "ids", ids, n);
        dj__mw_finish(&w);
        dj__meta m;
        CHECK_OK(dj__meta_parse(&m, (const uint8_t *)w.sb.data, w.sb.size));
        uint64_t gu = 0;
        int64_t gi = 0;
        double gf = 0;
        bool gb = false;
        char gs[32];
        int32_t *gids = NULL;
        size_t gn = 0;
        CHECK_OK(dj__meta_u64(&m, "u", true, &gu));
        CHECK_OK(dj__meta_i64(&m, "i", true, &gi));
        CHECK_OK(dj__meta_f64(&m, "f", true, &gf));
        CHECK_OK(dj__meta_bool(&m, "b", true, &gb));
        CHECK_OK(dj__meta_strcpy(&m, "s", true, gs, sizeof gs));
        CHECK_OK(dj__meta_ids(&m, "ids", true, &gids, &gn));
        CHECK(gu == u && gi == i && gf == f && gb == (bool)(it & 1) && !strcmp(gs, str) && gn == n);
        CHECK(n == 0 || !memcmp(gids, ids, n * sizeof *ids));
        free(gids);
        /* wrong types and missing fields */
        CHECK_ST(dj__meta_u64(&m, "s", true, &gu), DJ_EFORMAT);
        CHECK_ST(dj__meta_u64(&m, "i", true, &gu), DJ_EFORMAT);
        CHECK_ST(dj__meta_strcpy(&m, "u", true, gs, sizeof gs), DJ_EFORMAT);
        CHECK_ST(dj__meta_ids(&m, "s", true, &gids, &gn), DJ_EFORMAT);
        CHECK_ST(dj__meta_u64(&m, "absent", true, &gu), DJ_EFORMAT);
        gu = 7;
        CHECK_OK(dj__meta_u64(&m, "absent", false, &gu));
        CHECK(gu == 7);
        CHECK_ST(dj__meta_strcpy(&m, "s", true, gs, 2), DJ_ERANGE);
        dj__meta_destroy(&m);
        /* every strict prefix is truncated */
        const size_t cut = 1 + dj_test_rand() % (w.sb.size - 1);
        CHECK_ST(dj_meta_validate((const uint8_t *)w.sb.data, cut), DJ_EFORMAT);
        dj__mw_destroy(&w);
    }
}

static void test_meta_malformed(void) {
    /* each: bytes that must be refused */
    static const struct {
        const char *what;
        const char *b;
        size_t n;
    } bad[] = {
        {"not a map", "\x93\x01\x02\x03", 4},
        {"int key", "\x81\x01\x02", 3},
        {"truncated str", "\x81\xa1k\xa5" "ab", 6},
        {"array32 claiming 4G entries", "\x81\xa1k\xdd\xff\xff\xff\xff\x01", 9},
        {"map32 claiming 4G pairs", "\xdf\xff\xff\xff\xff", 5},
        {"reserved 0xc1", "\x81\xa1k\xc1", 4},
        {"duplicate key", "\x82\xa1k\x01\xa1k\x02", 7},
        {"trailing bytes", "\x80\x00", 2},
        {"bin32 past the end", "\x81\xa1k\xc6\x00\x10\x00\x00", 8},
        {"empty", "", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dj__meta m;
        dj_status st = dj__meta_parse(&m, (const uint8_t *)bad[i].b, bad[i].n);
        CHECK_MSG(st == DJ_EFORMAT || (bad[i].n == 0 && st == DJ_OK), "%s: got %s", bad[i].what, dj_status_name(st));
        if (st == DJ_OK) dj__meta_destroy(&m);
        if (bad[i].n) CHECK_ST(dj_meta_validate((const uint8_t *)bad[i].b, bad[i].n), DJ_EFORMAT);
    }
    /* nesting past the limit */
    uint8_t deep[64];
    size_t k = 0;
    deep[k++] = 0x81;
    deep[k++] = 0xa1;
    deep[k++] = 'k';
    while (k < 40) deep[k++] = 0x91;
    deep[k++] = 0x01;
    CHECK_ST(dj_meta_validate(deep, k), DJ_EFORMAT);
    /* random bytes never crash and are refused or parsed */
    uint8_t rnd[64];
    for (int it = 0; it < 20000; it++) {
        const size_t n = 1 + dj_test_rand() % sizeof rnd;
        for (size_t j = 0; j < n; j++) rnd[j] = (uint8_t)dj_test_rand();
        rnd[0] = (uint8_t)(0x80 | (dj_test_rand() % 4));
        dj__meta m;
        if (dj__meta_parse(&m, rnd, n) == DJ_OK) {
            CHECK(m.root.type == MSGPACK_OBJECT_MAP);
            dj__meta_destroy(&m);
        }
    }
    CHECK(1);
}

static void test_addr(void) {
    struct sockaddr_storage ss;
    socklen_t len;
    CHECK_OK(dj__addr_parse("127.0.0.1:7070", &ss, &len));
    CHECK(ss.ss_family == AF_INET);
    CHECK_OK(dj__addr_parse("[::1]:0", &ss, &len));
    CHECK(ss.ss_family == AF_INET6);
    CHECK_OK(dj__addr_parse("unix:/tmp/x.sock", &ss, &len));
    CHECK(ss.ss_family == AF_UNIX);
    CHECK_ST(dj__addr_parse("127.0.0.1", &ss, &len), DJ_EINVAL);
    CHECK_ST(dj__addr_parse("127.0.0.1:70000", &ss, &len), DJ_EINVAL);
    CHECK_ST(dj__addr_parse("unix:", &ss, &len), DJ_EINVAL);
    uint64_t a, b;
    CHECK_OK(dj__random_id(&a));
    CHECK_OK(dj__random_id(&b));
    CHECK(a != b && a && b);
}

int main(void) {
    dj_test_seeds();
    test_header();
    test_meta_roundtrip();
    test_meta_malformed();
    test_addr();
    return dj_test_finish("test_protocol");
}
