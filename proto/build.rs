//! Compiles the .proto files with protox (pure Rust), so building needs no protoc.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &["student/v1/student.proto", "users/v1/users.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;

    // Reflection serves this set; `compile_fds` does not write it, so encode it here.
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("descriptor.bin"), descriptors.encode_to_vec())?;

    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
