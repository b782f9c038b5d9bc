//! The one error type of certificate generation, writing and injection.

use std::path::PathBuf;

/// Why certificates could not be generated, written or injected.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("webhook configuration is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("webhook configuration: {0}")]
    NotWebhookConfig(String),
}
