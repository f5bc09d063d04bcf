#!/usr/bin/env bash
# test_python.sh - the psagg Python package: libpsagg loads into a process that has imported torch (in
# either order, no LD_PRELOAD), a bad config raises psagg.Error with PSAGG_ECONFIG and
# file:line, and `cmake --install` gives a package (psagg.torch a package too) that loads the
# installed libpsagg, and launchers that find their core (psagg.launch) in it.
# Usage: tests/functional/test_python.sh BUILD_DIR. Exit 0 passed, 1 failed, 77 skipped (no
# torch in Debian's /usr/bin/python3).
set -u -o pipefail
build=${1:?usage: test_python.sh BUILD_DIR}
py=/usr/bin/python3
"$py" -c "import torch" 2>/dev/null || { echo "test_python: SKIP: $py cannot import torch"; exit 77; }
# shellcheck source=tests/harness.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/../harness.sh"
unset PSAGG_LIBRARY LD_PRELOAD
printf '[cluster]\njob_id = x\nservers = 127.0.0.1:1\nworkers = 2\nbogus_key = 1\n' >"$tmp/bad.ini"
check='
import sys, psagg
try:
    psagg.Context(sys.argv[1], 0, 2)
except psagg.Error as e:
    assert e.name == "PSAGG_ECONFIG", e.name
    assert sys.argv[1] + ":5" in str(e), str(e)
    print("raised:", e)
else:
    sys.exit("no error for a bad config")
print("library:", psagg.library()._name)
'
for order in "import torch; import psagg.torch" "import psagg; psagg.library(); import torch, psagg.torch"; do
    out=$(PYTHONPATH=$build/python "$py" -c "$order
$check" "$tmp/bad.ini" 2>&1) || fail "build tree, '$order': $out"
    echo "test_python: build tree, $order: $out"
done
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "cmake --install"; }
site=$(ls -d "$tmp"/prefix/lib/python3*/dist-packages 2>/dev/null | head -n 1)
[[ -n $site && -f $site/psagg/torch/__init__.py ]] || fail "no installed package under $tmp/prefix/lib"
[[ ! -e $site/psagg/torch.py ]] || fail "the installed psagg.torch package has a torch.py beside it"
out=$(cd "$tmp" && PYTHONPATH=$site "$py" -c "import torch, psagg.torch
print('psagg.torch:', psagg.torch.__file__, psagg.torch.diloco.__file__)
$check" "$tmp/bad.ini" 2>&1) || fail "installed: $out"
[[ $out == *"library: $tmp/prefix/"* ]] || fail "installed package loaded another libpsagg: $out"
[[ $out == *"psagg.torch: $site/psagg/torch/__init__.py $site/psagg/torch/diloco.py"* ]] ||
    fail "installed package imported another psagg.torch: $out"
echo "test_python: installed: $out"
out=$(cd "$tmp" && "$tmp/prefix/bin/psagg-local" --config "$h_repo/conf/local.ini" --servers 0 --workers 1 \
    -- sh -c 'echo "worker $PSAGG_RANK of $PSAGG_WORLD_SIZE"' 2>&1) || fail "installed psagg-local: $out"
[[ $out == *"[worker 0] worker 0 of 1"* ]] || fail "installed psagg-local: $out"
echo "test_python: installed psagg-local ran a job"
echo "test_python: passed"
