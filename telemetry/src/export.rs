//! The OTLP exporter: HTTP/protobuf through the workspace's reqwest, or gRPC through tonic; every export runs
//! on a two-thread runtime of its own, off the batch processor's thread and off every request path.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
};

use crate::{resource, Export, Protocol};

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// A tracer provider exporting to `e` through a batch processor (its queue and delay from the standard
/// `OTEL_BSP_*` variables).
pub(crate) fn provider(e: &Export) -> anyhow::Result<SdkTracerProvider> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("otlp-export")
        .enable_all()
        .build()?;
    let resource = resource(&e.service_name);
    let mut inner = match e.protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(e.url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(Reqwest(
                reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build()?,
            ))
            .build()?,
        Protocol::Grpc => {
            // tonic's channel spawns its connection tasks on the runtime current at build time.
            let _in_rt = rt.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(e.url.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .build()?
        }
    };
    inner.set_resource(&resource);
    let exporter = OnRuntime {
        inner: Arc::new(inner),
        rt: Arc::new(rt),
    };
    let sampler = if e.roots {
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(e.sample_ratio)))
    } else {
        Sampler::ParentBased(Box::new(Sampler::AlwaysOff))
    };
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().build())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(resource)
        .build())
}

/// Runs each export of `inner` on `rt`.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    rt: Arc<tokio::runtime::Runtime>,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        self.rt
            .spawn(async move { inner.export(batch).await })
            .await
            .map_err(|e| OTelSdkError::InternalFailure(format!("export task: {e}")))?
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
}

/// OTLP/HTTP over the workspace's reqwest client.
#[derive(Debug)]
struct Reqwest(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Reqwest {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body);
        for (k, v) in &parts.headers {
            req = req.header(k, v);
        }
        let resp = req.send().await?;
        let mut out = http::Response::builder().status(resp.status());
        for (k, v) in resp.headers() {
            out = out.header(k, v);
        }
        let body = resp.bytes().await?;
        Ok(out.body(body)?)
    }
}
