//! Scale: volumes created and published over many VMs with 50 ms per API
//! call, against the controller binary (its memory is measured too). At
//! each checkpoint the latencies and the Proxmox calls per operation are
//! taken for a window of operations, to show they stay flat as volumes grow.
