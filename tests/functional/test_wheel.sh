#!/usr/bin/env bash
# test_wheel.sh SOURCE_DIR [PORT] - psagg installed as its users install it: pip, a venv, no
# network (docs/install.md).
#
# 1. A clean copy of the source (the files git knows, as a clone has them) is built into a
#    wheel with `pip wheel --no-index --no-build-isolation` (Debian's setuptools and wheel; CMake
#    builds libpsagg and psagg-server into the package; PSAGG_CUDA=OFF here: a CPU wheel, which
#    any host of this kind can use).
# 2. A fresh venv (--system-site-packages, for Debian's torch) installs it with --no-index.
# 3. From outside the source tree: `psagg-server --version` (the venv's console script) names
#    the project's version, `import psagg` finds the libpsagg inside the installed package (no
#    build tree, no LD_LIBRARY_PATH) and `import psagg.torch` takes the system's torch; the
#    venv's psagg-local runs a 2-server x 2-worker job of worker/examples/from_ddp.py with
#    psagg's DDP hook and with ServerOptimizer: every rank's final weights equal.
# 4. `pip uninstall` leaves nothing of psagg in the venv.
# Skipped (77) without /usr/bin/python3's venv, pip, setuptools and wheel, or without torch.
set -u -o pipefail
src=$1
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
py=/usr/bin/python3
for m in venv pip setuptools wheel torch; do
    "$py" -c "import $m" 2>/dev/null || { echo "test_wheel: SKIP: $py has no $m"; exit 77; }
done
reserve_ports 2 "${2:-}"
version=$(sed -n 's/^project(psagg VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project version in $src/CMakeLists.txt"

# 1. the wheel, from a clean copy
mkdir -p "$tmp/src" "$tmp/dist" "$tmp/elsewhere"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --) |
    tar -xf - -C "$tmp/src" || fail "copying the source"
t0=$(date +%s)
PSAGG_CUDA=OFF "$py" -m pip wheel --no-index --no-build-isolation --no-deps -w "$tmp/dist" "$tmp/src" \
    >"$tmp/wheel.log" 2>&1 || fail "pip wheel failed: $(tail -20 "$tmp/wheel.log")"
whl=$(ls "$tmp"/dist/psagg-"$version"-py3-none-linux_*.whl 2>/dev/null) ||
    fail "no psagg-$version-py3-none-linux_*.whl in $(ls "$tmp/dist")"
echo "built $(basename "$whl") ($(stat -c %s "$whl") bytes) in $(($(date +%s) - t0)) s"
contents=$("$py" -m zipfile -l "$whl")
for f in psagg/_lib/libpsagg.so.0 psagg/_bin/psagg-server psagg/torch/ddp.py psagg/cli.py; do
    grep -q " *$f " <<<"$contents" || grep -q "^$f " <<<"$contents" || fail "the wheel has no $f"
done
grep -q "_paths.py" <<<"$contents" && fail "the wheel carries a _paths.py (a build tree's path)"

# 2. a fresh venv, no network
"$py" -m venv --system-site-packages "$tmp/v" || fail "python3 -m venv failed"
v=$tmp/v
"$v/bin/pip" install --no-index --no-deps "$whl" >"$tmp/install.log" 2>&1 ||
    fail "pip install of the wheel failed: $(tail -20 "$tmp/install.log")"

# 3. from outside the source tree
cd "$tmp/elsewhere" || fail "cd"
for c in psagg-server psagg-local psagg-ssh psagg-slurm psagg-timeline; do
    [ -x "$v/bin/$c" ] || fail "the venv has no $c"
done
out=$("$v/bin/psagg-server" --version) || fail "psagg-server --version failed"
[[ $out == "psagg-server $version "* ]] || fail "psagg-server --version says '$out', not $version"
echo "$out"
"$v/bin/psagg-local" --help | grep -q '^Usage: psagg-local' || fail "psagg-local --help"
"$v/bin/psagg-timeline" --help | grep -q 'usage: psagg-timeline' || fail "psagg-timeline --help"
out=$(env -u PSAGG_LIBRARY -u LD_LIBRARY_PATH -u PYTHONPATH "$v/bin/python" -c '
import psagg, psagg.torch, torch
print(psagg.__version__, psagg.library()._name, psagg.torch.__name__, torch.__version__)') ||
    fail "import psagg / psagg.torch from the venv failed"
echo "import: $out"
read -r pv lib _ tv <<<"$out"
[ "$pv" = "$version" ] || fail "psagg.__version__ is $pv, not $version"
[[ $lib == "$v"/lib/python3*/site-packages/psagg/_lib/libpsagg.so.0 ]] ||
    fail "psagg loaded $lib, not the installed package's own libpsagg"

job_ini "$tmp/job.ini" 2 2 cluster.job_id="wheel-$port" cluster.op_timeout_ms=20000 \
    codec.min_compress_elems=256
for way in hook server; do
    envs=()
    [ $way = server ] && envs=(PSAGG_SERVER_OPTIMIZER=sgd)
    env -u PYTHONPATH -u PSAGG_SERVER_BIN ${envs[@]+"${envs[@]}"} "$v/bin/psagg-local" --config "$tmp/job.ini" \
        --timeout 240 -- "$v/bin/python" "$tmp/src/worker/examples/from_ddp.py" --way $way --steps 60 \
        >"$tmp/job-$way.log" 2>&1 || fail "the $way job under the venv's psagg-local failed: $(tail -20 "$tmp/job-$way.log")"
    grep -q "RESULT way=$way" "$tmp/job-$way.log" || fail "$way: no RESULT line"
    sums=$(grep -o 'PARAMS rank=[0-9] sha256=[0-9a-f]*' "$tmp/job-$way.log" | sed 's/.*sha256=//' | sort -u)
    (($(grep -c 'PARAMS rank=' "$tmp/job-$way.log") == 2)) && (($(wc -l <<<"$sums") == 1)) ||
        fail "$way: the ranks' weights differ or are missing: $sums"
    echo "$way: $(grep -o 'RESULT.*' "$tmp/job-$way.log"), every rank's weights $sums"
done

# 4. uninstalled cleanly
"$v/bin/pip" uninstall -y psagg >"$tmp/uninstall.log" 2>&1 || fail "pip uninstall failed"
left=$(ls -d "$v"/lib/python3*/site-packages/psagg* "$v"/bin/psagg-* 2>/dev/null)
[ -z "$left" ] || fail "pip uninstall left: $left"
echo "uninstalled: nothing of psagg left in the venv"
echo "test_wheel: ok"
