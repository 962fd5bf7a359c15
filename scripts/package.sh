#!/usr/bin/env bash
# Builds the Debian package: gridsync_<version>_<arch>.deb in build-package/.
# The package installs under /usr (binaries in /usr/bin, units in
# /usr/lib/systemd/system, the config in /etc/gridsync), and its Depends are
# the Debian runtime packages dpkg-shlibdeps finds the binaries need.
#   scripts/package.sh             # then: apt install ./build-package/gridsync_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_DIR="${GRIDSYNC_PACKAGE_DIR:-build-package}"
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DGRIDSYNC_BUILD_TESTS=OFF > "$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j "$(nproc)"
(cd "$BUILD_DIR" && cpack -G DEB)
deb=$(ls -t "$BUILD_DIR"/gridsync_*.deb | head -1)
dpkg-deb --field "$deb" Package Version Depends Recommends
echo "package: $deb"
