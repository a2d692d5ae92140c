# The process environment every launcher sets once set-up has run (sourced by train.sh, pipeline.sh and test.sh;
# every process they start inherits it): the memory allocator.
#
# XLA:CPU allocates each step's large temporaries afresh. glibc's malloc maps every one of them from the kernel and
# unmaps it when it is freed, so each step faults them in and the kernel zeroes them again, page by page. The shipped
# tiny critic job (2 cores, 2026-12-07) took 9.7 million page faults, 28 CPU-s in the kernel and 64 s:
# - with gperftools' tcmalloc preloaded (`libtcmalloc_minimal.so.4`, which launch/setup.sh installs from apt, as vLLM
#   advises for its CPU build), freed memory is reused: 0.26 million faults, 2 CPU-s in the kernel, 44 s;
# - where tcmalloc is not installed, glibc backs the chunks it maps with transparent huge pages
#   (`glibc.malloc.hugetlb=1`; glibc >= 2.35, and only where the kernel's THP mode is "madvise"): 0.35 million
#   faults, 9 CPU-s in the kernel, 48 s.
# The numbers the jobs compute are the same to the last bit. SWEET_JAX_TCMALLOC=0 leaves LD_PRELOAD alone; a value of
# glibc.malloc.hugetlb already in GLIBC_TUNABLES is kept.
case ":${GLIBC_TUNABLES:-}:" in
    *:glibc.malloc.hugetlb=*) ;;
    *) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
esac
if [ "${SWEET_JAX_TCMALLOC:-1}" != 0 ] && [[ "${LD_PRELOAD:-}" != *malloc* ]]; then
    SWEET_JAX_TCMALLOC_LIB="$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null \
        | awk '$1 == "libtcmalloc_minimal.so.4" { print $NF; exit }')"
    if [ -n "$SWEET_JAX_TCMALLOC_LIB" ]; then
        export LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$SWEET_JAX_TCMALLOC_LIB"
    fi
    unset SWEET_JAX_TCMALLOC_LIB
fi
