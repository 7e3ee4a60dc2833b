//! A local OTLP/HTTP trace receiver for the tests (binary protobuf, decoded with the
//! OTLP's own message types), and readers of span attributes. Included by path by the
//! test binaries that need it.
#![allow(dead_code)]

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value as Any};
use prost::Message;
use std::sync::{Arc, Mutex};

/// Every export request the receiver got, decoded.
pub(crate) type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

/// An OTLP/HTTP trace receiver on 127.0.0.1 (`POST /v1/traces`, protobuf), as a
/// collector answers: 200 with an (empty) `ExportTraceServiceResponse`; 400 for a body
/// that does not decode.
pub(crate) async fn receiver() -> (u16, Received) {
    use axum::body::Bytes;
    use axum::http::{StatusCode, header};
    let got: Received = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                let protobuf = headers
                    .get(header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
                match ExportTraceServiceRequest::decode(body) {
                    Ok(req) if protobuf => {
                        sink.lock().unwrap().push(req);
                        (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "application/x-protobuf")],
                            ExportTraceServiceResponse::default().encode_to_vec(),
                        )
                    }
                    _ => (
                        StatusCode::BAD_REQUEST,
                        [(header::CONTENT_TYPE, "text/plain")],
                        b"not an OTLP protobuf trace export".to_vec(),
                    ),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, got)
}

pub(crate) fn string_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Any::StringValue(s)) => Some(s.as_str()),
            _ => None,
        })
}

pub(crate) fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Any::IntValue(i)) => Some(*i),
            _ => None,
        })
}
