//! Running a program of an image or tree as it would run there: chrooted,
//! as a given user, with the image's PATH and nothing else of this
//! environment. Needs root.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Runs `args` chrooted into `root` as `uid`:`gid` (a non-root uid keeps no
/// capability); whether it succeeded, and its output.
pub fn run(root: &Path, uid: u32, gid: u32, args: &[&str]) -> std::io::Result<(bool, String)> {
    let root = root.to_path_buf();
    let Some((program, rest)) = args.split_first() else {
        return Err(std::io::Error::other("no program to run"));
    };
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/sbin:/usr/bin");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::chroot(&root)?;
            nix::unistd::chdir("/")?;
            nix::unistd::setgroups(&[])?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(gid))?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(uid))?;
            Ok(())
        });
    }
    let out = cmd.output()?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}
