#!/usr/bin/env bash
# Builds evb's packages into target/package/: Debian packages (evb and
# libevb-dev) and RPMs (evb and evb-devel). evb has the evb binary, libevb
# (libevb.so.0), the Python package (evb, abi3 for CPython >= 3.11), man
# pages, shell completions and the examples; the development package the
# header (evb.h, made by cbindgen), the static library, the libevb.so link
# and the pkg-config file.
# docs/integration.md says what goes where and how to install on a cluster.
#
#   scripts/package.sh                    # release build, then both packages
#   scripts/package.sh --prebuilt DIR     # package what DIR (target/release) holds
#   scripts/package.sh --stage-only ROOT  # only install the files under ROOT
#                                         # (Debian layout), no package
#   scripts/package.sh --lintian          # and lintian on the .deb files
#   WHEEL=1 scripts/package.sh            # also the Python wheel (maturin)
#
# A release build builds libevb on its own, without the message-engine
# features (MPI, UCX, libfabric), so that the library links none of them:
# an external consumer speaks tcp or shm. With --prebuilt (the test suite,
# which reuses what `cargo test --release` built) the library is the one
# built with the workspace's features. Compression: gzip; PKG_FAST=1 (the
# tests) stores the payload uncompressed instead.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

prebuilt=""
stage_only=""
lintian=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt=$2; shift 2 ;;
    --lintian) lintian=1; shift ;;
    --stage-only) stage_only=$2; shift 2 ;;
    *) echo "package.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch_deb=$(dpkg --print-architecture 2>/dev/null || echo amd64)
arch_rpm=$(uname -m)
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
out=target/package

if [ -z "$prebuilt" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  # Two builds: evb with every transport, libevb with tcp and shm only.
  cargo build --release -p evb-cli
  cargo build --release -p evb-ffi -p evb-py --target-dir target/libevb
  bin_dir=target/release
  lib_dir=target/libevb/release
else
  bin_dir=$prebuilt
  lib_dir=$prebuilt
fi
# A library built as a dependency (the tests' build) sits in deps/, one
# built on its own one level up: the newer of the two.
artifact() {
  local f
  f=$(ls -t "$1/$2" "$1/deps/$2" 2>/dev/null | head -1)
  [ -n "$f" ] || { echo "package.sh: no $2 in $1 or $1/deps: build first" >&2; exit 1; }
  echo "$f"
}
evb_bin=$(artifact "$bin_dir" evb)
lib_so=$(artifact "$lib_dir" libevb.so)
lib_a=$(artifact "$lib_dir" libevb.a)
py_so=$(artifact "$lib_dir" libevb_py.so)

# The header is made by cbindgen from src/capi.rs: where cbindgen is
# installed, the committed copy is brought up to date here (tests/cli/libevb.rs
# checks, without cbindgen, that it declares what capi.rs defines).
header=crates/evb-ffi/include/evb.h
if [ -z "$prebuilt" ] && command -v cbindgen >/dev/null 2>&1; then
  fresh=$(mktemp)
  cbindgen --quiet --config crates/evb-ffi/cbindgen.toml --crate evb-ffi --output "$fresh" crates/evb-ffi
  if ! cmp -s "$fresh" "$header"; then
    echo "package.sh: $header is not what cbindgen makes of crates/evb-ffi/src/capi.rs; updating it" >&2
    cp "$fresh" "$header"
  fi
  rm -f "$fresh"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Stripped once for every layout: the release profile keeps line tables
# (debug = 1); the static library keeps its symbols (a linker needs them).
stripped=$work/stripped
mkdir -p "$stripped"
pids=()
strip --strip-unneeded -o "$stripped/evb" "$evb_bin" & pids+=($!)
strip --strip-unneeded -o "$stripped/libevb.so" "$lib_so" & pids+=($!)
strip --strip-debug -o "$stripped/libevb.a" "$lib_a" & pids+=($!)
strip --strip-unneeded -o "$stripped/_evb.abi3.so" "$py_so" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done

# stage ROOT LIBDIR PYDIR: installs every file under ROOT, libraries in
# LIBDIR (usr/lib/<multiarch> or usr/lib64), the Python package in PYDIR.
stage() {
  local dest=$1 libdir=$2 pydir=$3
  rm -rf "$dest"
  install -d "$dest/usr/bin" "$dest/$libdir/pkgconfig" "$dest/usr/include" \
    "$dest/usr/share/man/man1" "$dest/usr/share/doc/evb/examples" "$dest/$pydir/evb" \
    "$dest/usr/share/bash-completion/completions" "$dest/usr/share/zsh/vendor-completions" \
    "$dest/usr/share/fish/vendor_completions.d"
  install -m 755 "$stripped/evb" "$dest/usr/bin/evb"
  install -m 644 "$stripped/libevb.so" "$dest/$libdir/libevb.so.$version"
  ln -s "libevb.so.$version" "$dest/$libdir/libevb.so.0"
  ln -s "libevb.so.0" "$dest/$libdir/libevb.so"
  install -m 644 "$stripped/libevb.a" "$dest/$libdir/libevb.a"
  install -m 644 "$header" "$dest/usr/include/evb.h"
  sed -e "s|@PREFIX@|/usr|" -e "s|@LIBDIR@|/$libdir|" -e "s|@VERSION@|$version|" \
    crates/evb-ffi/evb.pc.in >"$dest/$libdir/pkgconfig/evb.pc"
  install -m 644 "$stripped/_evb.abi3.so" "$dest/$pydir/evb/_evb.abi3.so"
  install -m 644 crates/evb-py/python/evb/*.py "$dest/$pydir/evb/"
  "$dest/usr/bin/evb" man "$dest/usr/share/man/man1"
  gzip -9n "$dest"/usr/share/man/man1/*.1
  "$dest/usr/bin/evb" completions bash >"$dest/usr/share/bash-completion/completions/evb"
  "$dest/usr/bin/evb" completions zsh >"$dest/usr/share/zsh/vendor-completions/_evb"
  "$dest/usr/bin/evb" completions fish >"$dest/usr/share/fish/vendor_completions.d/evb.fish"
  install -m 644 crates/evb-ffi/examples/c/*.c crates/evb-py/examples/*.py \
    "$dest/usr/share/doc/evb/examples/"
  install -m 644 docs/integration.md "$dest/usr/share/doc/evb/"
  printf 'evb (%s-1) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- evb developers <evb@example.org>  %s\n' \
    "$version" "$("$dest/usr/bin/evb" --version | sed -n 's/.*commit \([^)]*\)).*/\1/p')" \
    "$(date -R -u -d @"${SOURCE_DATE_EPOCH:-$(date +%s)}")" | gzip -9n >"$dest/usr/share/doc/evb/changelog.Debian.gz"
  cat >"$dest/usr/share/doc/evb/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: evb
Source: the evb repository

Files: *
Copyright: 2025-2026 the evb developers
License: Apache-2.0
 On Debian systems the full text of the license is in
 /usr/share/common-licenses/Apache-2.0.
EOF
}

if [ -n "$stage_only" ]; then
  stage "$stage_only" "usr/lib/$multiarch" "usr/lib/python3/dist-packages"
  exit 0
fi

# split ROOT DEV LIBDIR: moves the development files (header, static
# library, the unversioned .so link, pkg-config file) from ROOT to DEV.
split() {
  local from=$1 to=$2 libdir=$3
  install -d "$to/usr/include" "$to/$libdir" "$to/usr/share/doc"
  mv "$from/usr/include/evb.h" "$to/usr/include/"
  mv "$from/$libdir/libevb.a" "$from/$libdir/libevb.so" "$from/$libdir/pkgconfig" "$to/$libdir/"
  rmdir "$from/usr/include"
}

mkdir -p "$out"
rm -f "$out"/*.deb "$out"/*.rpm
compress=(-Zgzip -z9)
[ "${PKG_FAST:-0}" = 1 ] && compress=(-Zgzip -z1)

# ---- Debian: evb (the command, libevb.so.0, the Python package) and
# libevb-dev (what compiling against libevb needs).
deb_root=$work/deb
dev_root=$work/deb-dev
stage "$deb_root" "usr/lib/$multiarch" "usr/lib/python3/dist-packages"
split "$deb_root" "$dev_root" "usr/lib/$multiarch"
install -d "$dev_root/usr/share/doc/libevb-dev"
cp "$deb_root/usr/share/doc/evb/copyright" "$dev_root/usr/share/doc/libevb-dev/"
install -d "$deb_root/DEBIAN" "$dev_root/DEBIAN"
# Dependencies from the ELF files, as Debian's own packages get them.
mkdir -p "$work/shlibs/debian"
printf 'Source: evb\n\nPackage: evb\nArchitecture: any\n' >"$work/shlibs/debian/control"
depends=$(cd "$work/shlibs" && dpkg-shlibdeps -O -e"$deb_root/usr/bin/evb" \
  -e"$deb_root/usr/lib/$multiarch/libevb.so.$version" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
# libevb.so.0, for dpkg-shlibdeps of programs built against it.
echo "libevb 0 evb (>= $version)" >"$deb_root/DEBIAN/shlibs"
printf 'activate-noawait ldconfig\n' >"$deb_root/DEBIAN/triggers"
control() { # control ROOT PACKAGE DEPENDS SUMMARY DESCRIPTION
  cat >"$1/DEBIAN/control" <<EOF
Package: $2
Source: evb
Version: $version-1
Architecture: $arch_deb
Maintainer: evb developers <evb@example.org>
Installed-Size: $(du -sk --exclude=DEBIAN "$1" | cut -f1)
Depends: $3
Section: science
Priority: optional
Description: $4
$5
EOF
}
control "$deb_root" evb "$depends, python3 (>= 3.11)" "event builder for trigger-less data acquisition" \
" evb builds, predicts and debugs the event builders of trigger-less DAQ
 systems: the all-to-all network stage where every fragment of every
 collision comes together. This package has the evb command, libevb (a
 consumer of built events and a reader of the event store) and the evb
 Python package on the same library, man pages and shell completions."
control "$dev_root" libevb-dev "evb (= $version-1)" "libevb: development files (C header, static library, pkg-config)" \
" The header evb.h, libevb.a, the libevb.so link and evb.pc, for compiling
 C and C++ programs that consume an evb event builder's built events or
 read its event store (see /usr/share/doc/evb/integration.md)."
for r in "$deb_root:evb" "$dev_root:libevb-dev"; do
  deb=$out/${r##*:}_${version}-1_${arch_deb}.deb
  dpkg-deb --root-owner-group "${compress[@]}" --build "${r%%:*}" "$deb" >/dev/null
  echo "$deb"
done

# ---- RPM: evb and evb-devel (rpmbuild from Debian's rpm package builds
# what Alma/RHEL install; their Requires come from the ELF files).
rpm_root=$work/rpm-stage
rpm_dev=$work/rpm-dev
stage "$rpm_root" "usr/lib64" "usr/lib64/python3.11/site-packages"
split "$rpm_root" "$rpm_dev" "usr/lib64"
listing() { (cd "$1" && find . \( -type f -o -type l \) | sed 's|^\.||' | sort); }
payload="w9.gzdio"
[ "${PKG_FAST:-0}" = 1 ] && payload="w1.gzdio"
cat >"$work/evb.spec" <<EOF
Name: evb
Version: $version
Release: 1
Summary: Event builder for trigger-less data acquisition
License: Apache-2.0
URL: https://example.org/evb
%define _binary_payload $payload
%define __strip /bin/true
%define __brp_compress /bin/true
%define debug_package %{nil}
%define _build_id_links none
%description
evb builds, predicts and debugs the event builders of trigger-less DAQ
systems: the evb command, libevb (a consumer of built events and a reader
of the event store), the evb Python package, man pages and completions.
%package devel
Summary: libevb: development files (C header, static library, pkg-config)
Requires: evb = %{version}-%{release}
%description devel
The header evb.h, libevb.a, the libevb.so link and evb.pc, for C and C++.
%install
cp -a $rpm_root/. %{buildroot}/
cp -a $rpm_dev/. %{buildroot}/
%post -p /sbin/ldconfig
%postun -p /sbin/ldconfig
%files
$(listing "$rpm_root")
%files devel
$(listing "$rpm_dev")
EOF
rpmbuild -bb --quiet --define "_topdir $work/rpmbuild" --define "_rpmdir $root/$out" \
  --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
  "$work/evb.spec" >/dev/null
echo "$out/evb-$version-1.$arch_rpm.rpm"
echo "$out/evb-devel-$version-1.$arch_rpm.rpm"

# lintian on both .deb: slow (about 2 minutes on 2 cores for libevb-dev's
# static library); the tests run it on the evb package.
if [ "$lintian" = 1 ]; then
  lintian --tag-display-limit 0 --fail-on error "$out"/*.deb >&2
fi

if [ "${WHEEL:-0}" = 1 ]; then
  python3 -m maturin build --release -m crates/evb-py/Cargo.toml --out "$out"
fi
