//! API errors rendered as `metav1.Status`, the shape every Kubernetes client decodes.
//!
//! Follows `k8s.io/apimachinery/pkg/api/errors/errors.go` (`NewNotFound`,
//! `NewConflict`, `NewInvalid`, `NewForbidden`) and
//! `k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/status.go` (`ErrorToAPIStatus`).

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

/// An error the emulated API server answers with, as a `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(plural: &str, group: &str, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": plural});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(plural: &str, group: &str, name: &str) -> Self {
        Self {
            details: Some(details(plural, group, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", qualified(plural, group)),
            )
        }
    }

    pub fn already_exists(plural: &str, group: &str, name: &str) -> Self {
        Self {
            details: Some(details(plural, group, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(plural, group)),
            )
        }
    }

    pub fn conflict(plural: &str, group: &str, name: &str) -> Self {
        Self {
            details: Some(details(plural, group, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                     please apply your changes to the latest version and try again",
                    qualified(plural, group)
                ),
            )
        }
    }

    pub fn forbidden(plural: &str, group: &str, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(plural, group, name)),
            ..Self::new(
                403,
                "Forbidden",
                format!(
                    "{} \"{name}\" is forbidden: {why}",
                    qualified(plural, group)
                ),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(kind: &str, name: &str, why: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {why}"),
        )
    }

    /// `errors.NewInvalid`: `<Kind>.<group> "<name>" is invalid: <errors>`
    /// (one error bare, several in brackets), each error a cause, so kubectl
    /// prints `The <Kind> "<name>" is invalid: …`.
    pub fn invalid_fields(
        kind: &str,
        group: &str,
        name: &str,
        errors: &[(String, String)],
    ) -> Self {
        let shown: Vec<String> = errors.iter().map(|(f, d)| format!("{f}: {d}")).collect();
        let joined = match shown.as_slice() {
            [one] => one.clone(),
            _ => format!("[{}]", shown.join(", ")),
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|(field, detail)| {
                let reason = match detail.split(':').next().unwrap_or_default() {
                    "Required value" => "FieldValueRequired",
                    "Unsupported value" => "FieldValueNotSupported",
                    "Duplicate value" => "FieldValueDuplicate",
                    "Too many" => "FieldValueTooMany",
                    _ => "FieldValueInvalid",
                };
                json!({"reason": reason, "message": detail, "field": field})
            })
            .collect();
        let mut d = details(kind, group, name);
        d["causes"] = json!(causes);
        Self {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {joined}", qualified(kind, group)),
            )
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// The `metav1.Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

fn qualified(plural: &str, group: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_status())
    }
}

/// A JSON response with the content type clients expect.
pub fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (
        code,
        [(http::header::CONTENT_TYPE, "application/json")],
        bytes,
    )
        .into_response()
}
