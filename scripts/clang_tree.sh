# Sourced by fuzz.sh and sanitize.sh: configures a clang-14 build tree with
# AddressSanitizer and UBSan (RelWithDebInfo, no CUDA) unless it has been
# configured already, and points ccache at this checkout's root, so that a
# fresh clone's tree reuses the objects another checkout compiled.
#   configure_clang_tree BUILD_DIR [-DOPTION=VALUE ...]
configure_clang_tree() {
  local build=$1
  shift
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
      -DCMAKE_CXX_COMPILER=clang++-14 -DGRIDSYNC_SANITIZE=ON -DGRIDSYNC_ENABLE_CUDA=OFF "$@" \
      > "$build.configure.log"
  fi
}
