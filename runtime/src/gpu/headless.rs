//! Opening GPU adapters on a machine with no desktop session.
//!
//! Sits between a program's `main` and the process environment that wgpu's GL backend reads.

/// For a program's `main`, before it starts threads: where `XDG_RUNTIME_DIR` is unset (a
/// headless server, CI, a container), set it to a path that cannot exist, so that Mesa's EGL
/// (wgpu's GL adapter on Linux), which asks libwayland for a display, finds none without
/// libwayland printing "error: XDG_RUNTIME_DIR is invalid or not set in the environment."
/// twice per process, an error about a desktop the program never wanted. A session's own
/// `XDG_RUNTIME_DIR` is left alone; on other systems this does nothing. The path sits under a
/// file (`/dev/null`), so nobody can create it and put a socket there.
pub fn quiet_wayland_probe() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", "/dev/null/tandem-no-desktop");
    }
}
