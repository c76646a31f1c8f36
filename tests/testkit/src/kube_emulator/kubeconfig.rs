//! The kubeconfig the emulator writes once it is ready: one cluster (server URL,
//! and the CA when TLS is on), one user with the admin token, one context. It is
//! JSON, which is valid YAML, so kubectl and kube's config loader both read it.

use std::path::Path;

use base64::Engine;
use serde_json::{Value, json};

/// The kubeconfig document for `server`, authenticating with `token`.
pub fn document(server: &str, ca_pem: Option<&str>, token: &str) -> Value {
    let mut cluster = json!({ "server": server });
    if let Some(pem) = ca_pem {
        cluster["certificate-authority-data"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "kube-emulator", "cluster": cluster }],
        "users": [{ "name": "admin", "user": { "token": token } }],
        "contexts": [{
            "name": "kube-emulator",
            "context": { "cluster": "kube-emulator", "user": "admin", "namespace": "default" }
        }],
        "current-context": "kube-emulator",
        "preferences": {}
    })
}

/// Writes `document` to `path` atomically (temporary file, then rename), so a
/// reader polling for the file never sees half of it.
pub fn write(path: &Path, document: &Value) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let text = serde_json::to_string_pretty(document).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
