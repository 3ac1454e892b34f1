#!/bin/bash
# install_test.sh: `cmake --install` into a fresh prefix holds djinnd, djinn, libdjinn (.so and .a), the
# headers, djinn.pc, man pages, the systemd unit and the example config; a program built with
# `pkg-config --cflags --libs djinn` alone generates against the prefix's djinnd; djinnd says READY=1
# on $NOTIFY_SOCKET; and, where dpkg-deb is, `cpack -G DEB` makes a .deb of the same files.
#   install_test.sh BUILD_DIR SOURCE_DIR [EXTRA_CFLAGS]   (EXTRA_CFLAGS: -fsanitize=... of a sanitized build)
set -u
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) extra=${3:-}
dir=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
P=$dir/prefix
cmake --install "$build" --prefix "$P" >"$dir/install.log" 2>&1 || { cat "$dir/install.log"; fail "cmake --install"; }

for f in bin/djinnd bin/djinn lib/libdjinn.so lib/libdjinn.a include/djinn/client.h include/djinn/version.h \
         lib/pkgconfig/djinn.pc share/man/man8/djinnd.8 share/man/man1/djinn.1 lib/systemd/system/djinnd.service \
         etc/djinn/djinnd.conf share/doc/djinn/examples/djinnd.conf; do
    [ -e "$P/$f" ] || fail "$f is not installed"
done
"$P/bin/djinnd" --version | grep -q '^djinnd [0-9]*\.[0-9]*\.[0-9]* (protocol [0-9]*)$' || fail "djinnd --version"
"$P/bin/djinn" --version | grep -q '^djinn [0-9]*\.[0-9]*\.[0-9]*' || fail "djinn --version"
grep -q '^\.TH DJINND "8"' "$P/share/man/man8/djinnd.8" || fail "djinnd.8 is not a man page of section 8"
grep -qF 'max\-connections' "$P/share/man/man8/djinnd.8" || fail "djinnd.8 lacks the options"
# the unit runs the prefix's djinnd on the prefix's config, hardened
unit=$P/lib/systemd/system/djinnd.service
grep -qx "ExecStart=$P/bin/djinnd --config $P/etc/djinn/djinnd.conf" "$unit" || fail "the unit's ExecStart: $(grep Exec "$unit")"
for k in Type=notify DynamicUser=yes ProtectSystem=strict PrivateTmp=yes StateDirectory=djinn; do
    grep -qx "$k" "$unit" || fail "the unit lacks $k"
done
# libdjinn's archive holds no engine and needs nothing but msgpack and pthread
if nm "$P/lib/libdjinn.a" 2>/dev/null | grep -q ' [TU] dj_engine_\| [TU] dj_model_\| U cuda'; then
    fail "libdjinn.a holds or wants engine symbols"
fi

# The headers alone, and the example with pkg-config alone, shared and static.
export PKG_CONFIG_PATH=$P/lib/pkgconfig
printf '#include <djinn/client.h>\nint main(void) { dj_session_opts o = {0}; return o.qos != DJ_QOS_INTERACTIVE; }\n' >"$dir/h.c"
cc -std=c11 -Wall -Wextra -Wpedantic -Werror $extra -o "$dir/h" "$dir/h.c" $(pkg-config --cflags djinn) ||
    fail "djinn/client.h does not compile alone"
"$dir/h" || fail "a zeroed dj_session_opts is not interactive"
cc -std=c11 -Wall -Wextra -Wpedantic -Werror $extra -o "$dir/cg" "$src/examples/client_generate.c" \
    $(pkg-config --cflags --libs djinn) || fail "client_generate with pkg-config --cflags --libs djinn"
cc -std=c11 $extra -o "$dir/cgs" "$src/examples/client_generate.c" $(pkg-config --cflags djinn) \
    "$P/lib/libdjinn.a" $(pkg-config --static --libs-only-l djinn | sed 's/-ldjinn//') ||
    fail "client_generate on libdjinn.a"

# The prefix's djinnd, as the unit starts it, with $NOTIFY_SOCKET bound by a Python listener that writes what it hears.
/usr/bin/python3 - "$dir/notify" "$dir/heard" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1]); s.settimeout(120)
open(sys.argv[1] + ".up", "w").close()
with open(sys.argv[2], "ab", buffering=0) as f:
    while True:
        try: m = s.recv(4096)
        except socket.timeout: break
        f.write(m + b"\n--\n")
        if b"STOPPING=1" in m: break
PY
lpid=$!
for _ in $(seq 1 100); do [ -e "$dir/notify.up" ] && break; sleep 0.1; done
# The unit's own command line (its config, the example) with flags overriding what a test cannot use.
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
NOTIFY_SOCKET=$dir/notify $exec_start --listen "unix:$dir/sock" --port-file "$dir/port" --models "$src/models" \
    --http 127.0.0.1:0 --vmu-gb 256m --threads 1 2>"$dir/err" &
pid=$!
for _ in $(seq 1 600); do
    [ -e "$dir/port" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/err"; fail "djinnd exited"; }
    sleep 0.1
done
[ -e "$dir/port" ] || { cat "$dir/err"; fail "djinnd did not start"; }
LD_LIBRARY_PATH=$P/lib "$dir/cg" "unix:$dir/sock" demo "Once upon a time" 8 >"$dir/out1" || fail "client_generate (shared)"
grep -q ', 8 generated, length\]$' "$dir/out1" || { cat "$dir/out1"; fail "not 8 tokens"; }
ldd "$dir/cg" | grep -q "$P/lib/libdjinn.so" || LD_LIBRARY_PATH=$P/lib ldd "$dir/cg" | grep -q "$P/lib/libdjinn.so" ||
    fail "client_generate does not load the prefix's libdjinn.so"
"$dir/cgs" "unix:$dir/sock" demo "Once upon a time" 8 >"$dir/out2" || fail "client_generate (static)"
cmp -s "$dir/out1" "$dir/out2" || fail "the shared and static builds generate differently"
kill -HUP "$pid" # a reload says RELOADING=1, then READY=1 again
for _ in $(seq 1 100); do [ "$(grep -c '^READY=1' "$dir/heard")" -ge 2 ] && break; sleep 0.1; done
grep -q '^RELOADING=1' "$dir/heard" || { cat "$dir/heard"; fail "no RELOADING=1 after SIGHUP"; }
[ "$(grep -c '^READY=1' "$dir/heard")" -ge 2 ] || { cat "$dir/heard"; fail "no READY=1 after the reload"; }
kill "$pid"
wait "$pid" || { cat "$dir/err"; fail "djinnd exited with an error"; }
pid=
wait "$lpid"
grep -q '^READY=1' "$dir/heard" || { cat "$dir/heard"; fail "no READY=1 on NOTIFY_SOCKET"; }
grep -q '^STOPPING=1' "$dir/heard" || { cat "$dir/heard"; fail "no STOPPING=1 on NOTIFY_SOCKET"; }

# The .deb, where dpkg-deb is.
if command -v dpkg-deb >/dev/null && command -v cpack >/dev/null; then
    (cd "$dir" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$dir/deb" >"$dir/cpack.log" 2>&1) ||
        { tail -20 "$dir/cpack.log"; fail "cpack -G DEB"; }
    deb=$(ls "$dir"/deb/*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || fail "no .deb"
    dpkg-deb -c "$deb" | awk '{print $6}' >"$dir/deb.list"
    for f in ./usr/bin/djinnd ./usr/bin/djinn ./usr/include/djinn/client.h ./usr/lib/systemd/system/djinnd.service \
             ./etc/djinn/djinnd.conf ./usr/share/man/man8/djinnd.8; do
        grep -qx "$f" "$dir/deb.list" || { cat "$dir/deb.list"; fail "the .deb lacks $f"; }
    done
    grep -q '/libdjinn\.so\.[0-9.]*$' "$dir/deb.list" && grep -q '/libdjinn\.a$' "$dir/deb.list" &&
        grep -q '/pkgconfig/djinn\.pc$' "$dir/deb.list" || fail "the .deb lacks libdjinn or djinn.pc"
    dpkg-deb -I "$deb" >"$dir/deb.info"
    grep -q '^ Depends:.*libuv1' "$dir/deb.info" || { cat "$dir/deb.info"; fail "the .deb does not depend on libuv1"; }
    mkdir "$dir/x" && dpkg-deb -x "$deb" "$dir/x" && dpkg-deb -e "$deb" "$dir/x/DEBIAN" || fail "dpkg-deb -x"
    grep -qx '/etc/djinn/djinnd.conf' "$dir/x/DEBIAN/conffiles" || fail "djinnd.conf is not a conffile"
    grep -qx 'ExecStart=/usr/bin/djinnd --config /etc/djinn/djinnd.conf' "$dir/x/usr/lib/systemd/system/djinnd.service" ||
        fail "the .deb's unit: $(grep Exec "$dir/x/usr/lib/systemd/system/djinnd.service")"
    echo "deb: $(basename "$deb"), $(wc -l <"$dir/deb.list") entries"
else
    echo "dpkg-deb or cpack absent: the .deb is not checked"
fi
echo "ok"
