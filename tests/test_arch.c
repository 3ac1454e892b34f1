/* test_arch.c: the architectures beyond Llama from their published
 * config.json files - the keys each one reads (Qwen3's head_dim and q/k norm,
 * Gemma's soft-caps, scales and sliding pattern in both transformers 4 and 5
 * spellings, Phi-3's longrope and partial rotary, Mixtral's experts), the
 * refusals that name what is not supported, and the graph each one builds. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "djinn/checkpoint.h"
#include "djinn/engine.h"
#include "djinn/graph.h"
#include "djinn/op_table.h"
#include "model/model_graph.h"
#include "testutil.h"

static const char *QWEN3_8B =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 12288,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 36, \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 36, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null,"
    " \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": false,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char *GEMMA2_9B =
    "{\"architectures\": [\"Gemma2ForCausalLM\"], \"attn_logit_softcapping\": 50.0,"
    " \"final_logit_softcapping\": 30.0, \"head_dim\": 256, \"hidden_act\": \"gelu_pytorch_tanh\","
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 3584, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 8192, \"num_attention_heads\": 16, \"num_hidden_layers\": 42,"
    " \"num_key_value_heads\": 8, \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 10000.0, \"sliding_window\": 4096, \"vocab_size\": 256000}";

static const char *GEMMA3_1B =
    "{\"architectures\": [\"Gemma3ForCausalLM\"], \"attn_logit_softcapping\": null,"
    " \"final_logit_softcapping\": null, \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
    " \"hidden_size\": 1152, \"intermediate_size\": 6912, \"max_position_embeddings\": 32768,"
    " \"num_attention_heads\": 4, \"num_hidden_layers\": 26, \"num_key_value_heads\": 1,"
    " \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": 512, \"sliding_window_pattern\": 6,"
    " \"vocab_size\": 262144}";

/* transformers 5: both RoPEs in rope_parameters, the pattern in layer_types */
static const char *GEMMA3_V5 =
    "{\"architectures\": [\"Gemma3ForCausalLM\"], \"head_dim\": 16, \"hidden_activation\": \"gelu_pytorch_tanh\","
    " \"hidden_size\": 64, \"intermediate_size\": 160, \"max_position_embeddings\": 256,"
    " \"num_attention_heads\": 4, \"num_hidden_layers\": 3, \"num_key_value_heads\": 1,"
    " \"query_pre_attn_scalar\": 16, \"rms_norm_eps\": 1e-06, \"sliding_window\": 8,"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"],"
    " \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 8.0, \"rope_theta\": 1000000.0},"
    " \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}, \"vocab_size\": 288}";

static const char *PHI3_128K =
    "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_act\": \"silu\", \"hidden_size\": 3072,"
    " \"intermediate_size\": 8192, \"max_position_embeddings\": 131072, \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 32, \"original_max_position_embeddings\": 4096,"
    " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"long_factor\": [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5, 1.55, 1.6, 1.65, 1.7000000000000002, 1.75, 1.8, 1.85, 1.9, 1.9500000000000002, 2.0, 2.05, 2.1, 2.1500000000000004, 2.2, 2.25, 2.3, 2.35, 2.4000000000000004, 2.45, 2.5, 2.55, 2.6, 2.6500000000000004, 2.7, 2.75, 2.8, 2.85, 2.9000000000000004, 2.95, 3.0, 3.0500000000000003, 3.1, 3.15, 3.2, 3.25, 3.3000000000000003, 3.35], \"short_factor\": [1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.09, 1.1, 1.11, 1.12, 1.13, 1.1400000000000001, 1.15, 1.16, 1.17, 1.18, 1.19, 1.2, 1.21, 1.22, 1.23, 1.24, 1.25, 1.26, 1.27, 1.28, 1.29, 1.3, 1.31, 1.32, 1.33, 1.34, 1.35, 1.3599999999999999, 1.37, 1.38, 1.3900000000000001, 1.4, 1.4100000000000001, 1.42, 1.43, 1.44, 1.45, 1.46, 1.47],"
    " \"type\": \"longrope\"}, \"rope_theta\": 10000.0, \"sliding_window\": 262144, \"tie_word_embeddings\": false,"
    " \"vocab_size\": 32064}";

static const char *PHI4_MINI =
    "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_act\": \"silu\", \"hidden_size\": 3072,"
    " \"intermediate_size\": 8192, \"max_position_embeddings\": 131072, \"num_attention_heads\": 24,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"partial_rotary_factor\": 0.75,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"vocab_size\": 200064}";

static const char *MIXTRAL_8X7B =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"num_attention_heads\": 32,"
    " \"num_experts_per_tok\": 2, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
    " \"num_local_experts\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"sliding_window\": null,"
    " \"vocab_size\": 32000}";

/* text with the first `from` replaced by `to` (static buffer) */
static const char *subst(const char *text, const char *from, const char *to) {
    static char buf[16384];
    const char *p = strstr(text, from);
    CHECK_MSG(p != NULL, "test bug: '%s' not in the config", from);
    if (!p) return text;
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    return buf;
}

static dj_status parse(const char *json, dj_model_config *c) { return dj_model_config_parse(json, strlen(json), c); }

static void check_fail(const char *json, dj_status want, const char *needle) {
    dj_model_config c;
    dj_status st = parse(json, &c);
    CHECK_MSG(st == want, "parse gave %s, expected %s (%s)", dj_status_name(st), dj_status_name(want),
              dj_last_error());
    CHECK_MSG(strstr(dj_last_error(), needle) != NULL, "error '%s' does not name '%s'", dj_last_error(), needle);
}

/* ops of a graph, counted */
typedef struct { int n[DJ_OP_COUNT + 1]; } op_count;

/* An op node's sources as the op table says: none past its arity, and every
 * source the call reads as a required pointer present (bias and MOE_FFN's
 * sum so far may be absent). */
static void check_arity(const dj_node *nd) {
    const dj_op_desc *d = dj_op_desc_of(nd->op);
    if (!d) return; /* an input or weight */
    for (int s = 0; s < DJ_GRAPH_MAX_SRC; s++) {
        const bool need = s < d->n_src && d->src[s] != DJ_OPD_SRC_BIAS && d->src[s] != DJ_OPD_SRC_NONE &&
                          !(d->src[s] == DJ_OPD_SRC_X2 && nd->op == DJ_OP_MOE_FFN);
        CHECK_MSG(s < d->n_src || nd->src[s] == -1, "%s (%s): source %d past its arity %u", nd->name, d->name, s,
                  d->n_src);
        CHECK_MSG(!need || nd->src[s] >= 0, "%s (%s): source %d absent", nd->name, d->name, s);
    }
}

static op_count count_ops(const dj_model_config *c, dj_graph_t **keep) {
    op_count k;
    memset(&k, 0, sizeof k);
    dj_graph_t *g = NULL;
    CHECK_OK(dj_model_build_graph(c, NULL, DJ_PHASE_DECODE, 1, &g));
    for (int i = 0; g && i < dj_graph_count(g); i++) {
        const dj_node *nd = dj_graph_node_c(g, i);
        k.n[nd->op]++;
        check_arity(nd);
    }
    if (keep) *keep = g;
    else dj_graph_free(g);
    return k;
}

/* the ATTENTION node of layer l */
static const dj_node *attention_of(const dj_graph_t *g, int l) {
    for (int i = 0; i < dj_graph_count(g); i++) {
        const dj_node *nd = dj_graph_node_c(g, i);
        if (nd->op == DJ_OP_ATTENTION && nd->layer == l) return nd;
    }
    return NULL;
}

static void check_qwen3(void) {
    dj_model_config c;
    CHECK_OK(parse(QWEN3_8B, &c));
    CHECK(c.arch == DJ_ARCH_QWEN3 && c.head_dim == 128 && c.qk_norm && !c.attention_bias && !c.tie_word_embeddings);
    CHECK(c.sliding_window == 0 && c.hidden_act == DJ_ACT_SILU && c.rope_dim == 128 && c.rope_theta == 1e6f);
    op_count k = count_ops(&c, NULL);
    CHECK(k.n[DJ_OP_RMSNORM] == 4 * 36 + 1); /* input, post-attention, q and k per layer; final */
    CHECK(k.n[DJ_OP_SILU_MUL] == 36 && k.n[DJ_OP_SOFTCAP] == 0);
    check_fail(subst(QWEN3_8B, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu_pytorch_tanh\""),
               DJ_EUNSUPPORTED, "gelu_pytorch_tanh");
    check_fail(subst(QWEN3_8B, "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}"),
               DJ_EUNSUPPORTED, "yarn");
}

static void check_gemma2(void) {
    dj_model_config c;
    CHECK_OK(parse(GEMMA2_9B, &c));
    CHECK(c.arch == DJ_ARCH_GEMMA2 && c.hidden_act == DJ_ACT_GELU_TANH && c.tie_word_embeddings);
    CHECK(c.norm_offset == 1.0f && c.sandwich_norm && !c.qk_norm);
    CHECK(c.attn_softcap == 50.0f && c.final_softcap == 30.0f && c.attn_scale == 0.0625f);
    CHECK(fabsf(c.embed_scale - sqrtf(3584.0f)) < 1e-4f && c.sliding_window == 4096);
    dj_graph_t *g = NULL;
    op_count k = count_ops(&c, &g);
    CHECK(k.n[DJ_OP_RMSNORM] == 4 * 42 + 1 && k.n[DJ_OP_GELU_MUL] == 42 && k.n[DJ_OP_SOFTCAP] == 1);
    for (int l = 0; g && l < 4; l++) { /* even layers slide (transformers' default pattern) */
        const dj_node *a = attention_of(g, l);
        CHECK(a && a->params.window == (l % 2 ? 0u : 4096u) && a->params.softcap == 50.0f);
        CHECK(a && a->params.scale == 0.0625f);
    }
    dj_graph_free(g);
    /* null soft-caps are none; layer_types given explicitly win */
    CHECK_OK(parse(subst(GEMMA2_9B, "\"final_logit_softcapping\": 30.0", "\"final_logit_softcapping\": null"), &c));
    CHECK(c.final_softcap == 0.0f && c.attn_softcap == 50.0f);
    k = count_ops(&c, NULL);
    CHECK(k.n[DJ_OP_SOFTCAP] == 0);
    check_fail(subst(GEMMA2_9B, "\"hidden_activation\": \"gelu_pytorch_tanh\"", "\"hidden_activation\": \"gelu\""),
               DJ_EUNSUPPORTED, "hidden_activation \"gelu\"");
    check_fail(subst(GEMMA2_9B, "\"attn_logit_softcapping\": 50.0", "\"attn_logit_softcapping\": -1"), DJ_ERANGE,
               "attn_logit_softcapping");
}

static void check_gemma3(void) {
    dj_model_config c;
    CHECK_OK(parse(GEMMA3_1B, &c));
    CHECK(c.arch == DJ_ARCH_GEMMA3 && c.qk_norm && c.sandwich_norm && c.attn_softcap == 0.0f && c.final_softcap == 0.0f);
    CHECK(c.rope_theta == 1e6f && c.rope_local_theta == 1e4f && c.rope_type == DJ_ROPE_DEFAULT && c.tie_word_embeddings);
    dj_graph_t *g = NULL;
    count_ops(&c, &g);
    for (int l = 0; g && l < 12; l++) { /* every sixth layer global */
        const dj_node *a = attention_of(g, l);
        CHECK_MSG(a && a->params.window == ((l + 1) % 6 ? 512u : 0u), "gemma3 layer %d window", l);
    }
    dj_graph_free(g);
    CHECK_OK(parse(GEMMA3_V5, &c));
    CHECK(c.rope_theta == 1e6f && c.rope_type == DJ_ROPE_LINEAR && c.rope_factor == 8.0f && c.rope_local_theta == 1e4f);
    CHECK(c.sliding_window == 8 && c.attn_scale == 0.25f);
    g = NULL;
    count_ops(&c, &g);
    for (int l = 0; g && l < 3; l++) {
        const dj_node *a = attention_of(g, l);
        CHECK(a && a->params.window == (l == 1 ? 0u : 8u));
    }
    dj_graph_free(g);
    check_fail(subst(GEMMA3_V5, "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}",
                     "{\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 10000.0}"),
               DJ_EUNSUPPORTED, "sliding_attention");
    check_fail(subst(GEMMA3_V5, "\"sliding_attention\"]", "\"chunked_attention\"]"), DJ_EUNSUPPORTED, "layer_types[2]");
}

static void check_phi3(void) {
    dj_model_config c;
    CHECK_OK(parse(PHI3_128K, &c));
    CHECK(c.arch == DJ_ARCH_PHI3 && c.rope_type == DJ_ROPE_LONGROPE && c.rope_original_max_pos == 4096);
    CHECK(c.rope_dim == 96 && c.sliding_window == 262144 && c.rope_ext_factor[0] == 1.0f);
    CHECK(fabsf(c.rope_ext_factor[47] - 1.47f) < 1e-6f);
    CHECK(c.rope_long_factor[0] == 1.0f && fabsf(c.rope_long_factor[47] - 3.35f) < 1e-6f);
    /* transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)) */
    CHECK(fabsf(c.rope_attn_factor - (float)sqrt(1.0 + log(32.0) / log(4096.0))) < 1e-6f);
    CHECK_OK(parse(PHI4_MINI, &c));
    CHECK(c.rope_dim == 96 && c.head_dim == 128 && c.rope_type == DJ_ROPE_DEFAULT && c.tie_word_embeddings);
    dj_graph_t *g = NULL;
    count_ops(&c, &g);
    int ropes = 0;
    for (int i = 0; g && i < dj_graph_count(g); i++) {
        const dj_node *nd = dj_graph_node_c(g, i);
        if (nd->op == DJ_OP_ROPE) ropes += nd->params.rot_dim == 96;
    }
    CHECK(ropes == 2 * 32);
    dj_graph_free(g);
    check_fail(subst(PHI3_128K, "\"short_factor\": [", "\"short_factor\": [2.0, "), DJ_EFORMAT, "short_factor");
    check_fail(subst(PHI3_128K, "\"long_factor\": [1.0,", "\"long_factor\": [-1.0,"), DJ_EFORMAT, "long_factor[0]");
    check_fail(subst(PHI4_MINI, "\"partial_rotary_factor\": 0.75", "\"partial_rotary_factor\": 1.5"), DJ_ERANGE,
               "partial_rotary_factor");
}

static void check_mixtral(void) {
    dj_model_config c;
    CHECK_OK(parse(MIXTRAL_8X7B, &c));
    CHECK(c.arch == DJ_ARCH_MIXTRAL && c.n_experts == 8 && c.n_experts_used == 2 && c.sliding_window == 0);
    op_count k = count_ops(&c, NULL);
    CHECK(k.n[DJ_OP_MOE_ROUTE] == 32 && k.n[DJ_OP_MOE_FFN] == 8 * 32 && k.n[DJ_OP_SILU_MUL] == 0);
    check_fail(subst(MIXTRAL_8X7B, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9"), DJ_ERANGE,
               "num_experts_per_tok");
    check_fail(subst(MIXTRAL_8X7B, "\"num_local_experts\": 8", "\"num_local_experts\": 0"), DJ_ERANGE,
               "num_local_experts");
}

static void check_refusals(void) {
    check_fail(subst(MIXTRAL_8X7B, "MixtralForCausalLM", "DeepseekV3ForCausalLM"), DJ_EUNSUPPORTED,
               "DeepseekV3ForCausalLM");
    CHECK(strstr(dj_last_error(), "Gemma3ForCausalLM") && strstr(dj_last_error(), "MixtralForCausalLM"));
}

int main(void) {
    dj_test_seeds();
    check_qwen3();
    check_gemma2();
    check_gemma3();
    check_phi3();
    check_mixtral();
    check_refusals();
    return dj_test_finish("test_arch");
}
