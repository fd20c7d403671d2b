//! What hostd does to itself before it serves: it holds LUKS passphrases
//! and volume keys in memory, so no core dump may write them to disk and no
//! process of the same uid may read its memory through ptrace or /proc.

use nix::sys::resource::{Resource, setrlimit};

pub fn harden() -> Result<(), nix::Error> {
    // Not dumpable: no core file, /proc/<pid>/mem and ptrace for root only.
    nix::sys::prctl::set_dumpable(false)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_no_core_and_no_dumpable_memory() {
        harden().unwrap();
        assert!(!nix::sys::prctl::get_dumpable().unwrap());
        assert_eq!(
            nix::sys::resource::getrlimit(Resource::RLIMIT_CORE).unwrap(),
            (0, 0)
        );
    }
}
