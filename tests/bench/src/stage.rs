//! NodeStage against bare `mkfs` + `mount` on the same kind of loop device.
