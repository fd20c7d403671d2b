//! hostd's own metrics, beside the gRPC ones every binary serves: how long
//! each phase of a stage took, and the health facts as gauges.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::health::Health;
use crate::volume::Volumes;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

/// Seconds per stage phase: the keys of `StageResponse.timings_ms`
/// (hostd.proto names them).
static STAGE_PHASES: LazyLock<Family<PhaseLabels, Histogram>> = LazyLock::new(|| {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 3.0, 10)))
});

pub fn register(registry: &mut Registry, health: Arc<Health>, volumes: Arc<Volumes>) {
    registry.register(
        "hostd_stage_phase_duration_seconds",
        "Time of each phase of a NodeStage in hostd",
        STAGE_PHASES.clone(),
    );
    registry.register_collector(Box::new(HealthGauges { health, volumes }));
}

/// Records the phases of one stage.
pub fn observe_stage(timings_ms: &HashMap<String, u64>) {
    for (phase, ms) in timings_ms {
        STAGE_PHASES
            .get_or_create(&PhaseLabels {
                phase: phase.clone(),
            })
            .observe(*ms as f64 / 1000.0);
    }
}

/// The health facts, read at each scrape.
#[derive(Debug)]
struct HealthGauges {
    health: Arc<Health>,
    volumes: Arc<Volumes>,
}

impl Collector for HealthGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.volumes.refresh_health(&self.health);
        let facts = self.health.snapshot();
        for (name, help, value) in [
            (
                "hostd_udev_monitor_up",
                "1 while hostd's udev monitor runs (without it no disk is found)",
                i64::from(facts.udev_monitor_alive),
            ),
            (
                "hostd_devices_indexed",
                "Disks hostd knows by WWN",
                i64::from(facts.devices_indexed),
            ),
            (
                "hostd_volumes_staged",
                "Volumes staged under kubelet's directory",
                i64::from(facts.volumes_staged),
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}
