#!/usr/bin/env bash
# Install the packages psagg needs, online or from an offline bundle.
#
#   install-deps.sh                  install every Debian package psagg needs to build, test and
#                                    benchmark (apt; idempotent: packages already present are not
#                                    fetched again, apt's lists are refreshed only when something
#                                    is missing). Needs root (or sudo). run-tests.sh and CI use it.
#   install-deps.sh --bundle DIR     on a Debian host with apt: download into DIR every package
#                                    psagg needs to BUILD and RUN that a base image with a C
#                                    toolchain may lack (below), with DIR/manifest.tsv, a copy
#                                    of this script (DIR/install-deps.sh) and, when python3-sklearn
#                                    is installed, its digits data (DIR/data/digits.csv.gz) for
#                                    worker/examples/train_digits.py; and, run from a checkout
#                                    whose build dependencies are installed, psagg's wheel
#                                    (DIR/wheels/psagg-*.whl: `pip wheel` of the checkout, CPU
#                                    only unless PSAGG_CUDA=ON; docs/install.md).
#   install-deps.sh --from DIR [--prefix P | --dpkg] [--python PY]
#                                    install a bundle without network:
#                                    - dpkg mode (default on Debian of the bundle's release, as
#                                      root): `dpkg -i` of every bundled package not already
#                                      installed at that version or newer; dependencies come from
#                                      the bundle.
#                                    - prefix mode (default elsewhere, e.g. an Ubuntu image with
#                                      CUDA and PyTorch; or --prefix P): unpack the .debs into P
#                                      (default DIR/prefix) with dpkg-deb -x (ar + tar without
#                                      dpkg-deb), rewrite their pkg-config files to P, and write
#                                      P/env.sh. Then:
#                                        . P/env.sh   # PKG_CONFIG_PATH, LD_LIBRARY_PATH, PATH
#                                        cmake --preset default && cmake --build build
#                                      The presets find everything through pkg-config; binaries
#                                      get the prefix as RUNPATH, and LD_LIBRARY_PATH (env.sh)
#                                      supplies libfabric's own dependencies (libibverbs, ...).
#                                    --python PY: also install the bundle's wheel with
#                                    `PY -m pip install --no-index` (PY: a venv's python; its
#                                    libpsagg then loads the bundle's libraries through
#                                    env.sh's LD_LIBRARY_PATH in prefix mode).
#   install-deps.sh --help
#
# Which packages a bundle holds: the Depends/Pre-Depends closure (first alternative of each "a |
# b") of the roots below, minus what every Linux base image with a C compiler already has:
# the closure of Debian's Essential and Priority: required packages (what debootstrap
# --variant=minbase installs) and of build-essential (libc6-dev, libstdc++6, libatomic1, ...).
# Another distribution's base image holds most of those libraries but not always under the same
# soname (Ubuntu 24.04: libunistring.so.5, not .so.2), so the base libraries psagg's run-time
# libraries load (glibc and the compiler's runtime excepted) are bundled too, with role base:
# prefix mode links one into the prefix only where the host lacks its soname. A base package
# that a bundled one depends on with an exact version (zlib1g for zlib1g-dev, libgnutls30 for
# libgnutls28-dev) is bundled too, so dpkg -i never meets a version it cannot satisfy. Not
# bundled: CUDA, PyTorch, compilers, cmake (the GPU machine has them). The manifest gives each
# package a role: run (psagg's programs load it), build (headers, pkg-config files and what only
# they need), pinned (a base package bundled for an exact-version dependency) or base (above),
# and glibc_min: the newest GLIBC_x.y symbol version that the libraries psagg loads need; prefix
# mode refuses an older glibc.
# Prefix-mode caveats: LD_LIBRARY_PATH puts the bundle's libraries (same sonames, so ABI
# compatible) before the system's for programs run from that shell; libibverbs there looks for
# its RDMA drivers at Debian's path, so on an RDMA host prefer the host's own rdma-core (or
# dpkg mode). psagg's default providers (tcp, shm, the same-host path) need none of it.
set -euo pipefail

PKGS=(
    build-essential cmake pkg-config git python3 clang libclang-rt-14-dev
    libfabric-dev libfabric-bin libjemalloc-dev libinih-dev zlib1g-dev libsodium-dev libssl-dev
    openmpi-bin libopenmpi-dev
    python3-torch python3-sklearn python3-matplotlib python3-numpy
    python3-venv python3-pip python3-setuptools python3-wheel
    iproute2 nftables procps time
    openssh-server openssh-client slurmctld slurmd slurm-client munge
    libmicrohttpd-dev prometheus curl
)

# What a bundle must provide to build and run psagg (tests/examples included, not benchmarks).
BUNDLE_ROOTS=(
    libfabric-dev libfabric-bin libjemalloc-dev libinih-dev libsodium-dev libssl-dev
    libmicrohttpd-dev zlib1g-dev pkg-config
)
# What psagg's programs and libpsagg load (and pkg-config runs): the "run" part of a bundle.
RUNTIME_ROOTS=(libfabric1 libfabric-bin libjemalloc2 libinih1 libsodium23 libssl3 libmicrohttpd12 zlib1g
    pkgconf-bin)

say() { echo "install-deps: $*"; }
die() { echo "install-deps: $*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# The Depends/Pre-Depends closure of the packages given, by apt-cache; of each "a | b" group the
# first real package (a virtual one stands for its first provider). One name a line, sorted.
closure() {
    local -A seen=()
    local frontier=("$@") next p
    while [ ${#frontier[@]} -gt 0 ]; do
        for p in "${frontier[@]}"; do seen[$p]=1; done
        mapfile -t next < <(apt-cache depends --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances "${frontier[@]}" 2>/dev/null | awk '
            /^[^ ]/ { ingroup = 0; want = 0; virt = 0; next }
            /^ [ |](Pre)?Depends: / {
                if (!ingroup) want = 1
                name = $2; sub(/:any$/, "", name); virt = 0
                if (name ~ /^</) { virt = want }
                else if (want) { print name; want = 0 }
                ingroup = ($1 ~ /^\|/)
                next
            }
            /^    [^ ]/ { if (virt && want) { n = $1; sub(/:any$/, "", n); print n; want = 0; virt = 0 } }
            ' | sort -u)
        frontier=()
        for p in "${next[@]}"; do [ -n "${seen[$p]:-}" ] || frontier+=("$p"); done
    done
    printf '%s\n' "${!seen[@]}" | sort
}

# Packages that depend on another with "(= version)": "pkg dep" lines, for the packages given.
exact_deps() {
    apt-cache show --no-all-versions "$@" 2>/dev/null | awk '
        /^Package:/ { p = $2 }
        /^(Pre-)?Depends:/ {
            sub(/^[^:]*: /, ""); n = split($0, d, /, /)
            for (i = 1; i <= n; i++) if (d[i] ~ /\(= /) { split(d[i], w, " "); print p, w[1] }
        }'
}

# The newest GLIBC_x.y symbol version that ELF files under $1 need (empty when none).
glibc_needed() {
    find "$1" -type f \( -name '*.so*' -o -perm -u+x \) -print0 2>/dev/null |
        { xargs -0 -r objdump -T 2>/dev/null || true; } | grep -o 'GLIBC_[0-9][0-9.]*' |
        sed 's/GLIBC_//' | sort -uV | tail -1
}

# Unpack one .deb's files into $2: dpkg-deb where there is one, else ar + tar.
unpack_deb() {
    local deb=$1 dest=$2 member tmp
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$dest"
        return
    fi
    command -v ar >/dev/null || die "need dpkg-deb or ar (binutils) to unpack $deb"
    member=$(ar t "$deb" | grep '^data\.tar') || die "$deb: no data.tar member"
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$deb" "$member")
    case $member in
        *.xz) tar -xJf "$tmp/$member" -C "$dest" ;;
        *.zst) zstd -dc "$tmp/$member" | tar -x -C "$dest" ;;
        *.gz) tar -xzf "$tmp/$member" -C "$dest" ;;
        *) tar -xf "$tmp/$member" -C "$dest" ;;
    esac
    rm -rf "$tmp"
}

do_bundle() {
    local dir=$1 p
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
        die "--bundle needs a Debian host with apt-get and dpkg-deb"
    mkdir -p "$dir/debs"
    dir=$(cd "$dir" && pwd)
    if [ "$(id -u)" -eq 0 ]; then
        say "refreshing apt's lists"
        apt-get update -qq
    fi
    local t0=$SECONDS
    mapfile -t want < <(closure "${BUNDLE_ROOTS[@]}")
    local -A base=() inb=() role=()
    local roots
    mapfile -t roots < <(apt-cache dumpavail | awk '/^Package:/ { p = $2 }
        /^Essential: yes/ || /^Priority: required/ { print p }' | sort -u)
    while read -r p; do base[$p]=1; done < <(closure "${roots[@]}" build-essential)
    local -A run=()
    while read -r p; do run[$p]=1; done < <(closure "${RUNTIME_ROOTS[@]}")
    for p in "${want[@]}"; do
        [ -n "${base[$p]:-}" ] && continue
        inb[$p]=1
        if [ -n "${run[$p]:-}" ]; then role[$p]=run; else role[$p]=build; fi
    done
    # base libraries that psagg's run-time libraries load: a Debian base image has them, another
    # distribution's may not under that soname (Ubuntu 24.04 has libunistring.so.5, not .so.2,
    # which libmicrohttpd via libidn2 loads); role base: prefix mode uses each only where the host
    # lacks its soname. libc6, libgcc-s1 and libstdc++6 never: glibc_min covers those.
    for p in "${!run[@]}"; do
        [ -n "${base[$p]:-}" ] && [ -z "${inb[$p]:-}" ] || continue
        case $p in libc6 | libgcc-s1 | libstdc++6 | libcrypt1) continue ;; lib*) ;; *) continue ;; esac
        inb[$p]=1
        role[$p]=base
    done
    # base packages pinned by an exact-version dependency of a bundled one, until none is new
    local added=1 a b
    while [ $added -eq 1 ]; do
        added=0
        while read -r a b; do
            if [ -n "${inb[$a]:-}" ] && { [ -z "${inb[$b]:-}" ] || [ "${role[$b]}" = base ]; }; then
                [ -z "${inb[$b]:-}" ] && added=1
                inb[$b]=1; role[$b]=pinned
            fi
        done < <(exact_deps "${!inb[@]}")
    done
    mapfile -t list < <(printf '%s\n' "${!inb[@]}" | sort)
    say "${#list[@]} packages (closure of ${#want[@]} minus base ${#base[@]}; pinned base and base libraries added)"
    rm -f "$dir"/debs/*.deb
    (cd "$dir/debs" && apt-get download -q -o APT::Sandbox::User=root "${list[@]}" >/dev/null)
    # glibc_min: what the libraries psagg loads need (role run, and pinned ones it loads);
    # glibc_all: any bundled ELF file (build-only ones such as libevent included)
    local tmp glibc glibc_all f
    tmp=$(mktemp -d)
    mkdir "$tmp/run" "$tmp/all"
    for f in "$dir"/debs/*.deb; do
        p=$(dpkg-deb -f "$f" Package)
        dpkg-deb -x "$f" "$tmp/all"
        [ -z "${run[$p]:-}" ] || dpkg-deb -x "$f" "$tmp/run"
    done
    glibc=$(glibc_needed "$tmp/run")
    glibc_all=$(glibc_needed "$tmp/all")
    rm -rf "$tmp"
    . /etc/os-release
    {
        echo "# psagg dependency bundle: made $(date -u +%FT%TZ) on $PRETTY_NAME ($(dpkg --print-architecture)) by deploy/install-deps.sh --bundle"
        echo "# codename=${VERSION_CODENAME:-unknown} multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine) glibc_min=${glibc:-none} glibc_all=${glibc_all:-none}"
        echo "# roots: ${BUNDLE_ROOTS[*]}"
        printf '# package\tversion\tarch\trole\tsha256\tfile\n'
        for f in "$dir"/debs/*.deb; do
            p=$(dpkg-deb -f "$f" Package)
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$(dpkg-deb -f "$f" Version)" \
                "$(dpkg-deb -f "$f" Architecture)" "${role[$p]:-build}" \
                "$(sha256sum "$f" | cut -d' ' -f1)" "debs/$(basename "$f")"
        done
    } > "$dir/manifest.tsv"
    cp "$0" "$dir/install-deps.sh"
    chmod +x "$dir/install-deps.sh"
    # sklearn's digits for worker/examples/train_digits.py where PyTorch has no sklearn
    # (PSAGG_DIGITS=DIR/data/digits.csv.gz; tests/gpu/check-gpu.sh sets it)
    local digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
    if [ -f "$digits" ]; then
        mkdir -p "$dir/data"
        cp "$digits" "$dir/data/digits.csv.gz"
    fi
    bundle_wheel "$dir"
    say "bundle $dir: $(ls "$dir"/debs/*.deb | wc -l) .debs, $(du -sh "$dir" | cut -f1), runs on glibc >= ${glibc:-any} (build-only parts: ${glibc_all:-any}), $((SECONDS - t0)) s"
    say "install it offline with: $dir/install-deps.sh --from $dir [--prefix P]"
}

# psagg's wheel into DIR/wheels, when this script runs from a checkout that can build it (its
# build dependencies installed): otherwise say why not and go on (the bundle is still whole).
bundle_wheel() {
    local dir=$1 src
    src=$(cd "$(dirname -- "$0")/.." && pwd)
    rm -rf "$dir/wheels"
    if [ ! -f "$src/pyproject.toml" ]; then
        say "no wheel: $(dirname -- "$0") is not in a psagg checkout"
        return
    fi
    local py=/usr/bin/python3
    [ -x "$py" ] || py=python3
    if ! "$py" -c "import setuptools, wheel" 2>/dev/null || ! "$py" -m pip --version >/dev/null 2>&1 ||
        ! command -v cmake >/dev/null; then
        say "no wheel: $py's pip, setuptools and wheel and cmake are needed (deploy/install-deps.sh)"
        return
    fi
    mkdir -p "$dir/wheels"
    if PSAGG_CUDA=${PSAGG_CUDA:-OFF} "$py" -m pip wheel --no-index --no-build-isolation --no-deps \
        -w "$dir/wheels" "$src" >"$dir/wheels/build.log" 2>&1; then
        (cd "$dir/wheels" && sha256sum psagg-*.whl >SHA256SUMS)
        say "wheel: $(cd "$dir" && ls wheels/*.whl) (PSAGG_CUDA=${PSAGG_CUDA:-OFF})"
    else
        say "no wheel: pip wheel failed (log: $dir/wheels/build.log)"
    fi
}

# The bundle's wheel installed with `PY -m pip` (--from ... --python PY).
from_wheel() {
    local dir=$1 py=$2 whl
    whl=$(ls "$dir"/wheels/psagg-*.whl 2>/dev/null | head -1) || true
    [ -n "$whl" ] || die "--python: the bundle $dir has no wheel (make it from a checkout whose build dependencies are installed)"
    "$py" -m pip install --no-index --no-deps --force-reinstall "$whl" ||
        die "$py -m pip install $whl failed"
    say "installed $(basename "$whl") with $py"
}

# manifest field of the header line "# codename=... multiarch=... glibc_min=..."
manifest_var() { sed -n "s/^# .*\b$2=\([^ ]*\).*/\1/p" "$1/manifest.tsv" | head -1; }

# Every .deb of the manifest present with its sha256 (dies naming each one that is not).
verify_bundle() {
    local dir=$1 p sum file bad=0
    [ -f "$dir/manifest.tsv" ] || die "$dir/manifest.tsv missing: not a bundle (make one with --bundle)"
    while IFS=$'\t' read -r p _ _ _ sum file; do
        case $p in '#'* | '') continue ;; esac
        if [ ! -f "$dir/$file" ]; then echo "install-deps: $file missing" >&2; bad=1; continue; fi
        [ "$(sha256sum "$dir/$file" | cut -d' ' -f1)" = "$sum" ] ||
            { echo "install-deps: $file: sha256 differs from the manifest" >&2; bad=1; }
    done < "$dir/manifest.tsv"
    [ $bad -eq 0 ] || die "bundle $dir is damaged"
}

do_from_dpkg() {
    local dir=$1 p v file cur todo=()
    [ "$(id -u)" -eq 0 ] || die "dpkg mode needs root (or use --prefix P)"
    while IFS=$'\t' read -r p v _ _ _ file; do
        case $p in '#'* | '') continue ;; esac
        cur=$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null |
            awk '/install ok installed/ { print $NF }') || true
        if [ -n "$cur" ] && dpkg --compare-versions "$cur" ge "$v"; then continue; fi
        todo+=("$dir/$file")
    done < "$dir/manifest.tsv"
    if [ ${#todo[@]} -eq 0 ]; then
        say "dpkg: every bundled package already installed"
        return
    fi
    say "dpkg: installing ${#todo[@]} packages"
    DEBIAN_FRONTEND=noninteractive dpkg -i "${todo[@]}" > "$dir/dpkg.log" 2>&1 ||
        { tail -20 "$dir/dpkg.log" >&2; die "dpkg -i failed (log: $dir/dpkg.log)"; }
    say "dpkg: done (log: $dir/dpkg.log)"
}

do_from_prefix() {
    local dir=$1 prefix=$2 p file need have ma
    need=$(manifest_var "$dir" glibc_min)
    have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
    if [ -n "$need" ] && [ "$need" != none ] && [ -n "$have" ] &&
        [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
        die "the bundle's libraries need glibc >= $need, this system has $have"
    fi
    need=$(manifest_var "$dir" glibc_all)
    if [ -n "$need" ] && [ "$need" != none ] && [ -n "$have" ] &&
        [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
        say "note: some build-only files (not loaded by psagg) need glibc $need, this system has $have"
    fi
    ma=$(manifest_var "$dir" multiarch)
    mkdir -p "$prefix"
    prefix=$(cd "$prefix" && pwd)
    local role fallback=$prefix/fallback
    rm -rf "$fallback"
    while IFS=$'\t' read -r p _ _ role _ file; do
        case $p in '#'* | '') continue ;; esac
        if [ "$role" = base ]; then # used only for the sonames this host lacks (below)
            mkdir -p "$fallback"
            unpack_deb "$dir/$file" "$fallback"
        else
            unpack_deb "$dir/$file" "$prefix"
        fi
    done < "$dir/manifest.tsv"
    # pkg-config files: every /usr path (variables, -I, -L) moves under the prefix
    local pc
    for pc in "$prefix"/usr/lib/"$ma"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
        [ -f "$pc" ] || continue
        sed -i -E "s#(^[A-Za-z_.]+=|-I|-L|[ =])/usr(/|\$| )#\1$prefix/usr\2#g" "$pc"
    done
    # what maintainer scripts and the package layout would have done on a real system:
    # absolute symlinks (libz.so -> /lib/...) point into the prefix; every library's soname
    # exists (update-alternatives makes libpsm_infinipath.so.1 on Debian; ldconfig the rest)
    local l t f so
    while IFS= read -r l; do
        t=$(readlink "$l")
        case $t in "$prefix"/*) continue ;; esac # ours, from an earlier --from into this prefix
        ln -sfn "$prefix$t" "$l"
    done < <(find "$prefix" -type l -lname '/*')
    local lib=$prefix/usr/lib/$ma libs=$prefix/usr/lib/$ma:$prefix/lib/$ma
    if command -v readelf >/dev/null; then
        while IFS= read -r f; do
            so=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
            [ -n "$so" ] || continue
            [ -e "$(dirname "$f")/$so" ] || [ -e "$lib/$so" ] || [ -e "$prefix/lib/$ma/$so" ] ||
                ln -sfn "$f" "$lib/$so"
        done < <(find "$prefix" -type f -name 'lib*.so*')
    fi
    cat > "$prefix/env.sh" <<EOF
# psagg's dependency prefix (deploy/install-deps.sh --from $dir): source it, then build as usual
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:\$PATH"
export PSAGG_DEPS_PREFIX="$prefix"
EOF
    # every library psagg loads must resolve (inside the prefix or on this system); a soname the
    # host lacks comes from the bundle's base libraries (fallback/), linked into the prefix's
    # library directory, until nothing more resolves that way
    local missing used=() found again=1
    while :; do
        missing=$(for so in libfabric.so.1 libjemalloc.so.2 libinih.so.1 libsodium.so.23 libcrypto.so.3 libmicrohttpd.so.12; do
            LD_LIBRARY_PATH=$libs ldd "$lib/$so" 2>&1 | sed -n "s|^\t*\(.*\) => not found|$so needs \1|p"
        done)
        [ -n "$missing" ] && [ $again -eq 1 ] || break
        again=0
        for so in $(awk '{ print $NF }' <<<"$missing" | sort -u); do
            found=$(find "$fallback" -name "$so" \( -type f -o -type l \) 2>/dev/null | head -1)
            [ -n "$found" ] || continue
            ln -sfn "$(readlink -f "$found")" "$lib/$so"
            used+=("$so")
            again=1
        done
    done
    [ -z "$missing" ] || die "prefix $prefix is incomplete: $missing"
    [ ${#used[@]} -eq 0 ] || say "this host lacks ${used[*]}: linked from the bundle's base libraries ($fallback)"
    say "prefix $prefix: $(grep -vc '^#' "$dir/manifest.tsv") packages unpacked, pkg-config files rewritten"
    say "use it with:  . $prefix/env.sh && cmake --preset default && cmake --build build"
}

do_from() {
    local dir=$1 prefix=$2 mode=$3 py=$4 t0=$SECONDS
    [ -d "$dir" ] || die "no bundle at $dir"
    dir=$(cd "$dir" && pwd)
    verify_bundle "$dir"
    if [ -n "$py" ]; then # the wheel too, before anything is unpacked (from_wheel installs it)
        (cd "$dir/wheels" 2>/dev/null && sha256sum --quiet -c SHA256SUMS) >&2 ||
            die "$dir/wheels: no wheel, or a wheel's sha256 differs from SHA256SUMS"
    fi
    if [ -z "$mode" ]; then
        mode=prefix
        if [ -z "$prefix" ] && [ -r /etc/os-release ] && command -v dpkg >/dev/null &&
            [ "$(id -u)" -eq 0 ]; then
            local id codename
            id=$(. /etc/os-release && echo "${ID:-}")
            codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
            [ "$id" = debian ] && [ "$codename" = "$(manifest_var "$dir" codename)" ] && mode=dpkg
        fi
    fi
    if [ "$mode" = dpkg ]; then
        do_from_dpkg "$dir"
    else
        do_from_prefix "$dir" "${prefix:-$dir/prefix}"
    fi
    [ -z "$py" ] || from_wheel "$dir" "$py"
    say "--from done in $((SECONDS - t0)) s ($mode mode)"
}

if [ $# -gt 0 ]; then
    bundle="" from="" prefix="" mode="" python=""
    while [ $# -gt 0 ]; do
        case $1 in
            --bundle) bundle=${2:?--bundle needs DIR}; shift 2 ;;
            --from) from=${2:?--from needs DIR}; shift 2 ;;
            --prefix) prefix=${2:?--prefix needs P}; mode=prefix; shift 2 ;;
            --dpkg) mode=dpkg; shift ;;
            --python) python=${2:?--python needs PY}; shift 2 ;;
            -h | --help) usage; exit 0 ;;
            *) usage >&2; exit 2 ;;
        esac
    done
    if [ -n "$bundle" ]; then
        do_bundle "$bundle"
    elif [ -n "$from" ]; then
        do_from "$from" "$prefix" "$mode" "$python"
    else
        usage >&2
        exit 2
    fi
    exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#PKGS[@]} packages present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
