//! Heap profiles of the stack process, to see what its memory holds: with the
//! `heap-profile` feature, jemalloc is built with its profiler and
//! [`dump`] writes `DIR/heap-LABEL.prof` (for `jeprof`) when the process was
//! started with profiling on (`_RJEM_MALLOC_CONF=prof:true`; the binaries' jemalloc
//! reads its options under that prefixed name). Without the feature, or with
//! profiling off, [`dump`] does nothing: normal builds are unchanged.

use std::path::Path;

/// Writes a heap profile of this process to `dir/heap-{label}.prof`, if profiling is on.
#[cfg(feature = "heap-profile")]
pub fn dump(dir: &Path, label: &str) {
    let path = dir.join(format!("heap-{label}.prof"));
    let mut bytes = path.as_os_str().as_encoded_bytes().to_vec();
    bytes.push(0);
    // jemalloc takes the file name as a C string pointer; a dump or two per run, so
    // the few bytes are left to the process rather than freed.
    let name: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    match tikv_jemalloc_ctl::raw::write_str(b"prof.dump\0", name) {
        Ok(()) => eprintln!("heap profile written to {}", path.display()),
        // jemalloc refuses the dump when profiling is off.
        Err(error) => eprintln!(
            "heap profile not written to {} ({error}): start with _RJEM_MALLOC_CONF=prof:true to profile",
            path.display()
        ),
    }
}

/// Without the `heap-profile` feature there is no profiler to dump.
#[cfg(not(feature = "heap-profile"))]
pub fn dump(_dir: &Path, _label: &str) {}
