#!/usr/bin/env bash
# test_bundle_offline.sh - deploy.bundle_offline: a dependency bundle (deploy/install-deps.sh
# --bundle, made beforehand with network) installs without network into a fresh prefix, and
# psagg's libraries resolve there, not in the system's /usr:
#   1. install-deps.sh --from BUNDLE --prefix TMP (prefix mode: no root, no network, the
#      system untouched);
#   2. pkg-config (the prefix's own, from env.sh) gives include and library dirs inside the
#      prefix for libfabric, jemalloc, inih, libsodium, libcrypto, libmicrohttpd and zlib;
#   3. a C program calling each of them compiles with those flags (as CMake's pkg_check_modules
#      would), runs with env.sh's LD_LIBRARY_PATH, and ldd maps each library into the prefix;
#   4. a manifest whose sha256 does not match a .deb is refused;
#   5. the bundle's wheel (when it has one: --bundle from a checkout) installs with --from
#      ... --python into a fresh venv, psagg-server --version runs and import psagg loads the
#      package's libpsagg, its libfabric and libsodium from the prefix (env.sh); a wheel whose
#      sha256 differs from wheels/SHA256SUMS is refused;
#   6. base libraries (role base): on this host, which has libunistring.so.2, the prefix does not
#      link the bundle's; on a host that lacks it (hidden by an overlay whiteout in a private
#      mount namespace, as on Ubuntu 24.04, which has only .so.5) the prefix links it from the
#      bundle and libmicrohttpd resolves; skipped where unshare or overlayfs are refused.
# BUNDLE: $PSAGG_TEST_BUNDLE. Exit 0 passed, 1 failed, 77 skipped (no bundle given: making one
# needs the network, which CI may lack; `deploy/install-deps.sh --bundle /tmp/psagg-bundle`
# then PSAGG_TEST_BUNDLE=/tmp/psagg-bundle ctest -R deploy.bundle_offline). About 20 s.
set -u -o pipefail
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
bundle=${PSAGG_TEST_BUNDLE:-}
if [ -z "$bundle" ] || [ ! -f "$bundle/manifest.tsv" ]; then
    echo "bundle_offline: SKIP: no bundle (set PSAGG_TEST_BUNDLE to a deploy/install-deps.sh --bundle DIR)"
    exit 77
fi
fail() { echo "bundle_offline: FAIL: $*" >&2; exit 1; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "bundle_offline: SKIP: no C compiler"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psagg-bundle-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

# 1. offline install into a fresh prefix
"$repo/deploy/install-deps.sh" --from "$bundle" --prefix "$prefix" || fail "--from exited $?"
[ -f "$prefix/env.sh" ] || fail "no $prefix/env.sh"
(
    . "$prefix/env.sh"
    # 2. pkg-config: the prefix's binary, every directory under the prefix
    [ "$(command -v pkg-config)" = "$prefix/usr/bin/pkg-config" ] ||
        fail "pkg-config is $(command -v pkg-config), not the prefix's"
    mods="libfabric jemalloc inih libsodium libcrypto libmicrohttpd zlib"
    for m in $mods; do
        libdir=$(pkg-config --variable=libdir "$m") || fail "pkg-config does not know $m"
        case $libdir in "$prefix"/*) ;; *) fail "$m: libdir $libdir is outside the prefix" ;; esac
        echo "bundle_offline: $m $(pkg-config --modversion "$m") in $libdir"
    done
    flags=$(pkg-config --cflags --libs $mods) || fail "pkg-config --cflags --libs failed"
    for f in $flags; do
        case $f in -I/* | -L/*) case $f in -[IL]"$prefix"/*) ;; *) fail "flag $f outside the prefix" ;; esac ;; esac
    done
    # 3. compile, link, run, and see where each library came from
    cat >"$tmp/t.c" <<'C'
#include <ini.h>
#include <jemalloc/jemalloc.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <rdma/fabric.h>
#include <sodium.h>
#include <stdio.h>
#include <zlib.h>
static int on_key(void *user, const char *section, const char *name, const char *value)
{
    (void)section, (void)name, (void)value;
    ++*(int *)user;
    return 1;
}
int main(void)
{
    int keys = 0;
    void *p = malloc(64); /* jemalloc's */
    printf("fabric %u.%u sodium %s %s mhd %s zlib %s\n", FI_MAJOR(fi_version()),
           FI_MINOR(fi_version()), sodium_version_string(), OpenSSL_version(OPENSSL_VERSION),
           MHD_get_version(), zlibVersion());
    free(p);
    return sodium_init() < 0 || ini_parse_string("[a]\nb=1\n", on_key, &keys) != 0 || keys != 1;
}
C
    # shellcheck disable=SC2086
    "$cc" -o "$tmp/t" "$tmp/t.c" $flags || fail "the test program does not build with the prefix's flags"
    "$tmp/t" || fail "the test program does not run with env.sh's LD_LIBRARY_PATH"
    ldd "$tmp/t" >"$tmp/ldd.txt"
    cat "$tmp/ldd.txt"
    ! grep -q 'not found' "$tmp/ldd.txt" || fail "unresolved libraries"
    for so in libfabric.so.1 libjemalloc.so.2 libinih.so.1 libsodium.so.23 libcrypto.so.3 libmicrohttpd.so.12 \
        libibverbs.so.1 librdmacm.so.1 libpsm2.so.2; do
        grep -q "$so => $prefix/" "$tmp/ldd.txt" || fail "$so does not resolve into the prefix"
    done
) || exit 1

# 4. a damaged bundle is refused: the same .debs, one checksum changed
mkdir "$tmp/bad"
ln -s "$(cd "$bundle" && pwd)/debs" "$tmp/bad/debs"
awk -F'\t' 'BEGIN { OFS = "\t" } !/^#/ && !done { $5 = (substr($5, 1, 1) == "0" ? "1" : "0") substr($5, 2); done = 1 } { print }' \
    "$bundle/manifest.tsv" >"$tmp/bad/manifest.tsv"
if "$repo/deploy/install-deps.sh" --from "$tmp/bad" --prefix "$tmp/bad-prefix" 2>"$tmp/bad.err"; then
    fail "a manifest with a wrong sha256 was accepted"
fi
grep -q "sha256 differs" "$tmp/bad.err" || fail "wrong message for a bad checksum: $(cat "$tmp/bad.err")"
[ ! -e "$tmp/bad-prefix" ] || fail "a damaged bundle was unpacked"
# 5. the wheel, into a fresh venv, its libraries from the prefix
if ls "$bundle"/wheels/psagg-*.whl >/dev/null 2>&1; then
    py=/usr/bin/python3
    [ -x "$py" ] || py=python3
    "$py" -m venv "$tmp/v" || fail "python3 -m venv failed"
    "$repo/deploy/install-deps.sh" --from "$bundle" --prefix "$prefix" --python "$tmp/v/bin/python" ||
        fail "--from --python exited $?"
    (
        . "$prefix/env.sh"
        out=$("$tmp/v/bin/psagg-server" --version) || fail "the wheel's psagg-server --version failed"
        echo "bundle_offline: $out"
        lib=$("$tmp/v/bin/python" -c 'import psagg; print(psagg.library()._name)') ||
            fail "import psagg from the wheel failed"
        case $lib in "$tmp"/v/lib/python3*/site-packages/psagg/_lib/libpsagg.so.0) ;;
            *) fail "import psagg loaded $lib, not the wheel's" ;; esac
        ldd "$lib" >"$tmp/ldd-psagg.txt"
        for so in libfabric.so.1 libsodium.so.23; do
            grep -q "$so => $prefix/" "$tmp/ldd-psagg.txt" || fail "the wheel's libpsagg: $so does not resolve into the prefix"
        done
        echo "bundle_offline: the wheel's libpsagg ($lib) loads libfabric and libsodium from the prefix"
    ) || exit 1
    mkdir -p "$tmp/badw/wheels"
    ln -s "$(cd "$bundle" && pwd)/debs" "$tmp/badw/debs"
    cp "$bundle/manifest.tsv" "$tmp/badw/"
    cp "$bundle"/wheels/psagg-*.whl "$tmp/badw/wheels/"
    awk '{ $1 = (substr($1, 1, 1) == "0" ? "1" : "0") substr($1, 2); print $1 "  " $2 }' \
        "$bundle/wheels/SHA256SUMS" >"$tmp/badw/wheels/SHA256SUMS"
    if "$repo/deploy/install-deps.sh" --from "$tmp/badw" --prefix "$tmp/badw-prefix" --python "$tmp/v/bin/python" \
        2>"$tmp/badw.err"; then
        fail "a wheel whose sha256 differs from SHA256SUMS was installed"
    fi
    grep -q "sha256 differs" "$tmp/badw.err" || fail "wrong message for a bad wheel: $(cat "$tmp/badw.err")"
    [ ! -e "$tmp/badw-prefix" ] || fail "a bundle with a bad wheel was unpacked"
else
    echo "bundle_offline: the bundle has no wheel (made outside a checkout): step 5 not run"
fi
# 6. a base library the host lacks comes from the bundle, one it has does not
ma=$(sed -n 's/^# .*\bmultiarch=\([^ ]*\).*/\1/p' "$bundle/manifest.tsv" | head -1)
sysdir=/usr/lib/$ma
if ! grep -q "^libunistring2	.*	base	" "$bundle/manifest.tsv"; then
    fail "the manifest does not bundle libunistring2 (libmicrohttpd's, through libidn2) with role base"
fi
[ ! -e "$prefix/usr/lib/$ma/libunistring.so.2" ] ||
    fail "the prefix links libunistring.so.2 although this host has it"
if [ ! -e "$sysdir/libunistring.so.2" ]; then
    echo "bundle_offline: this host has no $sysdir/libunistring.so.2: step 6's hiding not run"
elif ! unshare -m true 2>/dev/null; then
    echo "bundle_offline: unshare -m refused: step 6's hiding not run"
else
    mkdir -p "$tmp/ovl/up" "$tmp/ovl/work"
    for f in "$sysdir"/libunistring.so.2*; do
        mknod "$tmp/ovl/up/$(basename "$f")" c 0 0 || fail "mknod (an overlay whiteout) failed"
    done
    unshare -m bash -c '
        set -u
        mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/ovl/up,workdir=$2/ovl/work" "$1" || exit 77
        ldd "$1/libmicrohttpd.so.12" | grep -q "libunistring.so.2 => not found" ||
            { echo "bundle_offline: FAIL: the overlay did not hide libunistring.so.2" >&2; exit 1; }
        "$3/deploy/install-deps.sh" --from "$4" --prefix "$2/prefix-lacking" >"$2/lacking.log" 2>&1 ||
            { cat "$2/lacking.log" >&2; echo "bundle_offline: FAIL: --from on a host lacking libunistring.so.2 exited $?" >&2; exit 1; }
        grep -q "lacks libunistring.so.2" "$2/lacking.log" ||
            { echo "bundle_offline: FAIL: --from did not say it linked libunistring.so.2" >&2; exit 1; }
        . "$2/prefix-lacking/env.sh"
        ldd "$2/prefix-lacking/usr/lib/$5/libmicrohttpd.so.12" | grep "libunistring.so.2 => $2/prefix-lacking/" ||
            { echo "bundle_offline: FAIL: libunistring.so.2 does not resolve into the prefix" >&2; exit 1; }
    ' step6 "$sysdir" "$tmp" "$repo" "$bundle" "$ma"
    rc=$?
    if [ $rc -eq 77 ]; then
        echo "bundle_offline: overlayfs refused: step 6's hiding not run"
    elif [ $rc -ne 0 ]; then
        exit 1
    else
        echo "bundle_offline: a host lacking libunistring.so.2 gets the bundle's (step 6)"
    fi
fi
echo "bundle_offline: passed"
