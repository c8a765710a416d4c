//! The gRPC contract shared by `student-svc`, `users-svc` and `relay`: code generated from
//! `proto/student/v1/student.proto` and `proto/users/v1/users.proto`, and the encoded file
//! descriptor sets that server reflection serves.

/// `student.v1`: the Student service.
pub mod student {
    pub mod v1 {
        tonic::include_proto!("student.v1");

        /// Encoded descriptors of `student.v1` and its imports, for server reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("student_descriptor");
    }
}

/// `users.v1`: the Users service.
pub mod users {
    pub mod v1 {
        tonic::include_proto!("users.v1");

        /// Encoded descriptors of `users.v1` and its imports, for server reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("users_descriptor");
    }
}
