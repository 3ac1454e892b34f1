/* test_switches.c: the environment switches' table (src/core/switches.h) -
 * README.md's switch table names exactly its switches, and each reads as before. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/switches.h"
#include "djinn/status.h"
#include "testutil.h"

/* One README row: | `VAR` | values | default | what | */
typedef struct {
    char var[64], values[128], dflt[64];
} readme_row;

/* The cell's text without surrounding blanks and backticks. */
static void cell(const char *a, const char *b, char *out, size_t cap) {
    while (a < b && (*a == ' ' || *a == '`')) a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '`')) b--;
    size_t n = (size_t)(b - a) < cap - 1 ? (size_t)(b - a) : cap - 1;
    memcpy(out, a, n);
    out[n] = '\0';
}

/* The rows of README's switch table (lines starting "| `DJINN_"). */
static int readme_rows(readme_row *rows, int cap) {
    char *text = dj_test_read_file(DJ_SOURCE_DIR "/README.md", NULL);
    CHECK_MSG(text != NULL, "cannot read %s/README.md", DJ_SOURCE_DIR);
    if (!text) return 0;
    int n = 0;
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        if (!strncmp(line, "| `DJINN_", 9) && n < cap) {
            const char *c[5];
            int k = 0;
            for (const char *p = line; *p && k < 5; p++)
                if (*p == '|') c[k++] = p;
            CHECK_MSG(k == 5, "README switch row without 4 cells: %s", line);
            if (k == 5) {
                cell(c[0] + 1, c[1], rows[n].var, sizeof rows[n].var);
                cell(c[1] + 1, c[2], rows[n].values, sizeof rows[n].values);
                cell(c[2] + 1, c[3], rows[n].dflt, sizeof rows[n].dflt);
                n++;
            }
        }
        line = end ? end + 1 : NULL;
    }
    free(text);
    return n;
}

/* README's table against the code's: the same variables, each once, with
 * the same values ("a, b" for "a|b") and default. */
static void check_readme(void) {
    readme_row rows[64];
    const int n = readme_rows(rows, 64);
    CHECK_MSG(n > 0, "README.md has no switch table (rows \"| `DJINN_...` |\")");
    bool seen[DJ_SW_COUNT] = {false};
    for (int i = 0; i < n; i++) {
        int found = -1;
        for (int s = 0; s < DJ_SW_COUNT; s++)
            if (!strcmp(rows[i].var, dj_switch_desc_of((dj_switch)s)->var)) found = s;
        CHECK_MSG(found >= 0, "README names %s, which src/core/switches.h does not have", rows[i].var);
        if (found < 0) continue;
        CHECK_MSG(!seen[found], "README names %s twice", rows[i].var);
        seen[found] = true;
        const dj_switch_desc *d = dj_switch_desc_of((dj_switch)found);
        if (!d->values) continue; /* a setting: any string */
        char want[128];
        size_t w = 0;
        for (const char *p = d->values; *p && w + 3 < sizeof want; p++) {
            if (*p == '|') {
                want[w++] = ',';
                want[w++] = ' ';
            } else {
                want[w++] = *p;
            }
        }
        want[w] = '\0';
        CHECK_MSG(!strcmp(rows[i].values, want), "README gives %s the values \"%s\", the code \"%s\"", d->var,
                  rows[i].values, want);
        CHECK_MSG(!strcmp(rows[i].dflt, d->dflt), "README gives %s the default \"%s\", the code \"%s\"", d->var,
                  rows[i].dflt, d->dflt);
    }
    for (int s = 0; s < DJ_SW_COUNT; s++)
        CHECK_MSG(seen[s], "README's switch table lacks %s", dj_switch_desc_of((dj_switch)s)->var);
}

/* dj_switch_read of s with its variable set to v (NULL: unset); *warned: it
 * wrote a line to stderr naming the variable. */
static int read_with(dj_switch s, const char *v, bool *warned) {
    const char *var = dj_switch_desc_of(s)->var;
    if (v) setenv(var, v, 1);
    else unsetenv(var);
    char path[] = "/tmp/dj_switches_XXXXXX";
    const int fd = mkstemp(path);
    fflush(stderr);
    const int saved = dup(2);
    if (fd >= 0) dup2(fd, 2);
    const int got = dj_switch_read(s);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[512] = "";
    if (fd >= 0) {
        const ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
        buf[r > 0 ? r : 0] = '\0';
        close(fd);
        unlink(path);
    }
    *warned = strstr(buf, var) != NULL;
    unsetenv(var);
    return got;
}

/* Each switch as it read before the table: unset and empty give the
 * default, every listed value itself, anything else what it always meant,
 * now with a warning. */
static void check_reads(void) {
    for (int s = 0; s < DJ_SW_COUNT; s++) {
        const dj_switch_desc *d = dj_switch_desc_of((dj_switch)s);
        if (!d->values) continue;
        bool warned = false;
        int dflt = -1, other = -1, i = 0;
        char vals[128];
        snprintf(vals, sizeof vals, "%s", d->values);
        for (char *v = strtok(vals, "|"); v; v = strtok(NULL, "|"), i++) {
            if (!strcmp(v, d->dflt)) dflt = i;
            if (!strcmp(v, d->other)) other = i;
        }
        CHECK_MSG(dflt >= 0 && other >= 0, "%s: default %s or other %s not among %s", d->var, d->dflt, d->other,
                  d->values);
        CHECK_MSG(read_with((dj_switch)s, NULL, &warned) == dflt && !warned, "%s unset", d->var);
        CHECK_MSG(read_with((dj_switch)s, "", &warned) == dflt && !warned, "%s empty", d->var);
        snprintf(vals, sizeof vals, "%s", d->values);
        i = 0;
        for (char *v = strtok(vals, "|"); v; v = strtok(NULL, "|"), i++) {
            char one[64];
            snprintf(one, sizeof one, "%s", v);
            CHECK_MSG(read_with((dj_switch)s, one, &warned) == i && !warned, "%s=%s", d->var, one);
        }
        CHECK_MSG(read_with((dj_switch)s, "bogus", &warned) == other && warned, "%s=bogus: want %s and a warning",
                  d->var, d->other);
    }
    /* what each meant before the table, spelled out */
    bool w = false;
    CHECK(read_with(DJ_SW_PROFILE, "yes", &w) == 1 && w);           /* any value but 0 was on */
    CHECK(read_with(DJ_SW_NO_GRAPHS, "2", &w) == 1 && w);
    CHECK(read_with(DJ_SW_WEIGHTS_IN_PLACE, "false", &w) == 1 && w); /* only 0 turned it off */
    CHECK(read_with(DJ_SW_HUGE_REREAD, "0", &w) == 0 && !w);
    CHECK(read_with(DJ_SW_DEVICE_SAMPLING, "OFF", &w) == 1 && w);    /* only "off" turned it off */
    CHECK(read_with(DJ_SW_FUSE, "off", &w) == 0 && !w);
    CHECK(read_with(DJ_SW_ATTN, "simple", &w) == 2 && read_with(DJ_SW_ATTN, "tc", &w) == 1);
    CHECK(read_with(DJ_SW_ATTN, "wgmma", &w) == 0 && w);
    CHECK(read_with(DJ_SW_LOG, "verbose", &w) == DJ_LOG_WARN && w);
    CHECK(read_with(DJ_SW_LOG, "debug", &w) == DJ_LOG_DEBUG && read_with(DJ_SW_LOG, "error", &w) == DJ_LOG_ERROR);
    CHECK(read_with(DJ_SW_CPU_ISA, "avx2", &w) == 1 && read_with(DJ_SW_CPU_ISA, "sse", &w) == 2 && w);
    /* the string setting */
    unsetenv("DJINN_MODEL");
    CHECK(dj_switch_read_str(DJ_SW_MODEL) == NULL && dj_switch_read(DJ_SW_MODEL) == 0);
    setenv("DJINN_MODEL", "", 1);
    CHECK(dj_switch_read_str(DJ_SW_MODEL) == NULL);
    setenv("DJINN_MODEL", "/m/x", 1);
    CHECK(dj_switch_read_str(DJ_SW_MODEL) && !strcmp(dj_switch_read_str(DJ_SW_MODEL), "/m/x"));
    CHECK(dj_switch_read_str(DJ_SW_FUSE) == NULL && dj_switch_desc_of(DJ_SW_COUNT) == NULL);
    unsetenv("DJINN_MODEL");
}

int main(void) {
    check_readme();
    check_reads();
    return dj_test_finish("test_switches");
}
