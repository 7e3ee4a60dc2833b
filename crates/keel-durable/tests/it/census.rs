//! `Engine::open_census` counts open instances by workflow and status from the
//! database; `OpenCensusGauge` exports it, reading 0 for pairs that emptied.

use crate::common::*;
use keel_durable::{OpenCensusGauge, OpenCount, RunStatus};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;

fn count(workflow: &str, status: RunStatus, count: u64) -> OpenCount {
    OpenCount {
        workflow: workflow.to_owned(),
        status,
        count,
    }
}

#[tokio::test]
async fn the_census_counts_open_instances_by_status_and_leaves_out_ended_ones() {
    let db = database().await;
    let engine = engine(db.pool(), fast_config());
    assert_eq!(engine.open_census().await.unwrap(), vec![]);
    // No executor yet: both wait in `pending`.
    let a = engine
        .start::<Waiter>("a", &waiter("go", None, None), opts())
        .await
        .unwrap();
    let b = engine
        .start::<Waiter>("b", &waiter("go", None, None), opts())
        .await
        .unwrap();
    assert_eq!(
        engine.open_census().await.unwrap(),
        vec![count("test.waiter", RunStatus::Pending, 2)]
    );
    let ex = spawn(&engine);
    for id in [a.instance_id, b.instance_id] {
        until(&engine, id, "signal wait", |s| s.wait.is_some()).await;
    }
    assert_eq!(
        engine.open_census().await.unwrap(),
        vec![count("test.waiter", RunStatus::Waiting, 2)]
    );
    engine
        .signal(a.instance_id, "go", "1", &json!(true))
        .await
        .unwrap();
    until_status(&engine, a.instance_id, RunStatus::Completed).await;
    assert_eq!(
        engine.open_census().await.unwrap(),
        vec![count("test.waiter", RunStatus::Waiting, 1)]
    );
    ex.shutdown().await;
}

fn gauges(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let DebugValue::Gauge(v) = value else {
                return None;
            };
            (key.name() == "keel_durable_open_instances").then(|| {
                let labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (labels.join(","), v.into_inner())
            })
        })
        .collect();
    out.sort_by(|x, y| x.0.cmp(&y.0));
    out
}

#[test]
fn the_gauge_reports_every_open_status_of_registered_workflows_and_zeroes_emptied_pairs() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let mut gauge = OpenCensusGauge::new(["w.one"]);
        gauge.export(&[count("w.two", RunStatus::Running, 3)]);
        let first = gauges(&snapshotter);
        assert!(
            first.contains(&("workflow=w.two,status=running".to_owned(), 3.0)),
            "{first:?}"
        );
        for status in ["pending", "running", "waiting", "suspended"] {
            let key = format!("workflow=w.one,status={status}");
            assert!(first.contains(&(key, 0.0)), "{first:?}");
        }
        gauge.export(&[count("w.one", RunStatus::Waiting, 1)]);
        let second = gauges(&snapshotter);
        assert!(
            second.contains(&("workflow=w.two,status=running".to_owned(), 0.0)),
            "an emptied pair must read 0: {second:?}"
        );
        assert!(
            second.contains(&("workflow=w.one,status=waiting".to_owned(), 1.0)),
            "{second:?}"
        );
    });
}
