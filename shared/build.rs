//! The migrations are embedded at compile time (refinery's `embed_migrations!`);
//! rebuild when the folder changes, so a new migration is never left out.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
