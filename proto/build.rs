//! Compiles the .proto files with protox (pure Rust), so building needs no protoc.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &["student/v1/student.proto", "users/v1/users.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    // Reflection serves one set per service, so each server lists only what it serves;
    // `compile_fds` does not write descriptor sets, so encode them here.
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    for (proto, name) in PROTOS
        .iter()
        .zip(["student_descriptor", "users_descriptor"])
    {
        let set = protox::compile([proto], ["."])?;
        fs::write(out_dir.join(format!("{name}.bin")), set.encode_to_vec())?;
    }

    let descriptors = protox::compile(PROTOS, ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
