//! `/openapi/v2`, as much of it as clients need. kubectl fetches it for
//! client-side validation (`--validate`, which skips kinds the document does not
//! define) and for patch strategies (it falls back to its compiled-in types
//! for built-in kinds, and uses merge patch for custom resources); kube does not
//! read it. The emulator therefore serves a valid Swagger 2.0 document without
//! definitions: validation is left to the server (pruning and 422s), as with
//! `--validate=false`. `/openapi/v3` is absent, as on v1.20, so kubectl falls
//! back to v2. kubectl asks for protobuf and parses the answer as protobuf
//! whatever its content type, so that request gets the protobuf encoding.

use serde_json::{Value, json};

pub fn v2() -> Value {
    json!({
        "swagger": "2.0",
        "info": { "title": "Kubernetes", "version": "v1.20.2-emulator" },
        "paths": {},
        "definitions": {}
    })
}

fn protobuf_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push((field << 3) | 2);
    let mut len = bytes.len();
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(bytes);
}

/// The same document as gnostic's `openapi_v2.Document` protobuf, which is what
/// kubectl asks for (it parses the answer as protobuf whatever its type says).
pub fn v2_protobuf() -> Vec<u8> {
    let mut info = Vec::new();
    protobuf_field(&mut info, 1, b"Kubernetes");
    protobuf_field(&mut info, 2, b"v1.20.2-emulator");
    let mut document = Vec::new();
    protobuf_field(&mut document, 1, b"2.0");
    protobuf_field(&mut document, 2, &info);
    protobuf_field(&mut document, 8, &[]);
    document
}
