//! Checks a response against the OpenAPI document: the path template, method and
//! status must be declared, the media type must be one the response declares, and the
//! body must validate (JSON Schema Draft 2020-12, `$ref`s into `#/components/schemas`
//! resolved against the document) against that media type's schema.
//!
//! Shared by keel-api's tests (`tests/it/common.rs`) and the binary's e2e tests
//! (`crates/keel/tests/it/common/mod.rs` includes this file with `#[path]`).

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The document and the validators compiled from it so far, keyed by
/// `METHOD template status media-type`.
pub(crate) struct DocCheck {
    doc: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

impl DocCheck {
    /// Checks against `doc` (the OpenAPI document as JSON).
    pub(crate) fn new(doc: Value) -> Self {
        Self {
            doc,
            validators: Mutex::new(HashMap::new()),
        }
    }

    /// The template of `doc.paths` that `path` (without its query) matches: literal
    /// segments equal, `{param}` segments any non-empty segment; the template with the
    /// most literal segments wins.
    fn template(&self, path: &str) -> Option<String> {
        let segments: Vec<&str> = path.split('/').collect();
        let paths = self.doc["paths"].as_object()?;
        paths
            .keys()
            .filter_map(|t| {
                let ts: Vec<&str> = t.split('/').collect();
                if ts.len() != segments.len() {
                    return None;
                }
                let mut literals = 0;
                for (t, s) in ts.iter().zip(&segments) {
                    if t.starts_with('{') && t.ends_with('}') {
                        if s.is_empty() {
                            return None;
                        }
                    } else if t == s {
                        literals += 1;
                    } else {
                        return None;
                    }
                }
                Some((literals, t.clone()))
            })
            .max()
            .map(|(_, t)| t)
    }

    /// Checks one response; `Err` says what disagrees with the document.
    pub(crate) fn check(
        &self,
        method: &str,
        uri: &str,
        status: u16,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<(), String> {
        let path = uri.split(['?', '#']).next().unwrap_or(uri);
        let method = method.to_ascii_lowercase();
        let Some(template) = self.template(path) else {
            return Err(format!("{method} {path}: no path of the document matches"));
        };
        let label = format!("{method} {template} {status}");
        let Some(op) = self.doc["paths"][&template].get(&method) else {
            return Err(format!("{label}: the document declares no {method} here"));
        };
        let responses = &op["responses"];
        let Some(response) = responses
            .get(status.to_string())
            .or_else(|| responses.get("default"))
        else {
            return Err(format!("{label}: status not declared"));
        };
        let Some(content) = response.get("content").and_then(Value::as_object) else {
            return if body.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{label}: declared without a body, but one was sent"
                ))
            };
        };
        let media = content_type
            .and_then(|c| c.split(';').next())
            .map(str::trim)
            .unwrap_or("");
        let Some(declared) = content.get(media) else {
            return Err(format!(
                "{label}: media type {media:?} not declared (declared: {:?})",
                content.keys().collect::<Vec<_>>()
            ));
        };
        if media == "text/csv" {
            // A CSV body (a snapshot export): declared as a string; it must be UTF-8
            // text (its shape is checked by the test that reads it).
            return std::str::from_utf8(body)
                .map(|_| ())
                .map_err(|_| format!("{label}: text/csv body is not UTF-8"));
        }
        let instance: Value =
            serde_json::from_slice(body).map_err(|e| format!("{label}: body is not JSON ({e})"))?;
        // A media type without a schema (`/openapi.json`) admits any JSON body.
        let Some(schema) = declared.get("schema") else {
            return Ok(());
        };
        let validator = self.validator(&format!("{label} {media}"), schema)?;
        let mut errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("at {}: {e}", e.instance_path()))
            .collect();
        unchecksummed_addresses(&instance, "", &mut errors);
        if media == "application/problem+json" && !self.lists_error_code(&instance, status) {
            errors.push(format!(
                "(code, status) ({}, {status}) is not in Problem.x-error-codes",
                instance["code"]
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{label}: body does not match the document:\n  {}\nbody: {instance}",
                errors.join("\n  ")
            ))
        }
    }

    /// Whether `Problem.x-error-codes` lists the problem's `code` with `status`.
    ///
    /// (Below `check`: every address a response holds is EIP-55 checksummed.)
    fn lists_error_code(&self, problem: &Value, status: u16) -> bool {
        self.doc["components"]["schemas"]["Problem"]["x-error-codes"]
            .as_array()
            .is_some_and(|rows| {
                rows.iter().any(|r| {
                    r["code"] == problem["code"] && r["status"].as_u64() == Some(u64::from(status))
                })
            })
    }

    /// Checks `body` against the `Problem` schema alone: for answers to requests the
    /// document does not describe (an unknown route, a method a path lacks).
    // Used by keel-api's tests; the binary's e2e tests send only documented requests.
    #[allow(dead_code)]
    pub(crate) fn check_problem(&self, body: &[u8]) -> Result<(), String> {
        let instance: Value =
            serde_json::from_slice(body).map_err(|e| format!("body is not JSON ({e})"))?;
        let validator =
            self.validator("Problem", &json!({"$ref": "#/components/schemas/Problem"}))?;
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("at {}: {e}", e.instance_path()))
            .collect();
        let status = instance["status"].as_u64().unwrap_or(0);
        let status = u16::try_from(status).unwrap_or(0);
        let mut errors = errors;
        if !self.lists_error_code(&instance, status) {
            errors.push(format!(
                "(code, status) ({}, {status}) is not in Problem.x-error-codes",
                instance["code"]
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "not a Problem of the document:\n  {}\nbody: {instance}",
                errors.join("\n  ")
            ))
        }
    }

    fn validator(&self, key: &str, schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
        let mut cache = self.validators.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = cache.get(key) {
            return Ok(v.clone());
        }
        // The response's schema as the root's only subschema, next to the document's
        // components, so `#/components/schemas/...` resolves.
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "allOf": [schema],
            "components": self.doc["components"],
        });
        let v = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .map_err(|e| format!("{key}: the document's schema does not compile: {e}"))?;
        let v = Arc::new(v);
        cache.insert(key.to_owned(), v.clone());
        Ok(v)
    }
}

/// Pushes an error for every string of `v` (at JSON pointer `at`) that is an address (`0x`
/// and 40 hex digits) but not in its EIP-55 checksummed form: the API serves every
/// address checksummed (`keel_api::dto::address_text`).
fn unchecksummed_addresses(v: &Value, at: &str, errors: &mut Vec<String>) {
    match v {
        Value::String(s)
            if s.len() == 42
                && s.starts_with("0x")
                && s[2..].bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            let checksummed: Option<String> = s.parse().ok().map(keel_api::dto::address_text);
            if checksummed.as_deref() != Some(s.as_str()) {
                errors.push(format!("at {at}: address {s} is not EIP-55 checksummed"));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unchecksummed_addresses(item, &format!("{at}/{i}"), errors);
            }
        }
        Value::Object(members) => {
            for (k, item) in members {
                unchecksummed_addresses(item, &format!("{at}/{k}"), errors);
            }
        }
        _ => {}
    }
}
