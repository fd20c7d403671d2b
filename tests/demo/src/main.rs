//! `make demo`: the driver's main job, end to end, on a simulated Proxmox
//! cluster, one narrated step at a time. With QEMU, the worker is a real
//! guest VM that the disk is hot-plugged into (as Proxmox does it, over QMP);
//! without it, a loop device on this host stands in for the disk.

mod guest;
mod host;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok();
    if qemu && std::env::var_os("DEMO_WITHOUT_GUEST").is_none() {
        guest::run().await
    } else {
        println!(
            "QEMU is not installed here: the disk reaches the worker as a loop device on this host instead of a guest VM."
        );
        host::run().await
    }
}
