# pack-lib.sh - sourced by gpu-demo.sh and bench-system.sh: carry binaries to a gpu machine that
# lacks the Debian packages they link (libuv, nng, cjson, http-parser), and set them up there.
#   pack_bins DIR FILE...      FILEs into DIR/bin (stripped), the shared libraries they need
#                              (not glibc, not the compiler runtime, not cuda) and those named
#                              in PACK_EXTRA_LIBS into DIR/lib, and
#                              all of DIR as DIR.tgz (a third of the size, for a copy that
#                              limits what it carries: the four CUDA binaries are ~12 MiB each)
#   pack_env DIR OUT SHM_GIB   there: DIR from DIR.tgz when only that came, LD_LIBRARY_PATH,
#                              OUT/env.txt, every library found, /dev/shm of at least SHM_GIB
#                              (the host KV pool is shared memory)

pack_bins() {
    _dir=$1
    shift
    rm -rf "$_dir" && mkdir -p "$_dir/bin" "$_dir/lib" || return 1
    for _f; do cp "$_f" "$_dir/bin/" || return 1; done
    strip "$_dir"/bin/*
    ldd "$_dir"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcublas[A-Za-z]*)\.so' |
        while read -r _lib; do cp -L "$_lib" "$_dir/lib/"; done
    # libraries the programs open at run time (PACK_EXTRA_LIBS: paths; missing ones skipped)
    for _lib in ${PACK_EXTRA_LIBS:-}; do
        [ -f "$_lib" ] && cp -L "$_lib" "$_dir/lib/"
    done
    tar czf "$_dir.tgz" -C "$(dirname "$_dir")" "$(basename "$_dir")" || return 1
    du -sh "$_dir" "$_dir.tgz"
}

pack_env() {
    _dir=$1 _out=$2 _shm_gib=$3
    mkdir -p "$_out" || return 1
    if [ ! -d "$_dir/bin" ] && [ -f "$_dir.tgz" ]; then
        tar xzf "$_dir.tgz" -C "$(dirname "$_dir")" || return 1
    fi
    _cuda_lib=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
    LD_LIBRARY_PATH="$_dir/lib:$_cuda_lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    {
        nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
        uname -r; ldd --version | head -1; df -h /dev/shm; ulimit -l
        echo "debian packages the build uses, present here:"
        ldconfig -p | grep -E 'libuv|libnng|libcjson|libsqlite3|libsystemd|libpcre2-8|libhttp_parser' || echo none
    } >"$_out/env.txt" 2>&1
    cat "$_out/env.txt"
    if ldd "$_dir"/bin/* | grep -q "not found"; then
        ldd "$_dir"/bin/* | grep "not found"
        echo "a library is missing (above); pack again with the missing one" >&2
        return 1
    fi
    _shm_kb=$(df -k /dev/shm | awk 'NR == 2 {print $2}')
    [ "${_shm_kb:-0}" -ge $((_shm_gib * 1048576)) ] ||
        mount -o remount,size="$((_shm_gib + 8))g" /dev/shm 2>/dev/null || true
}
