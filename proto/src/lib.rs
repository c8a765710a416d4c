//! The gRPC contract shared by `student-svc`, `users-svc` and `relay`: code generated from
//! `proto/student/v1/student.proto` and `proto/users/v1/users.proto`, and the encoded file
//! descriptor sets that server reflection serves.

/// `student.v1`: the Student service.
pub mod student {
    pub mod v1 {
        tonic::include_proto!("student.v1");

        /// The `google.rpc.ErrorInfo` domain of the Student service's reasons.
        pub const ERROR_DOMAIN: &str = "students.v1";

        /// Encoded descriptors of `student.v1` and its imports, for server reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("student_descriptor");
    }
}

/// `users.v1`: the Users service.
pub mod users {
    pub mod v1 {
        tonic::include_proto!("users.v1");

        /// The `google.rpc.ErrorInfo` domain of the Users service's reasons; a caller
        /// passing a Users reason on (the relay) keeps it.
        pub const ERROR_DOMAIN: &str = "users.v1";

        /// Response header (value `true`) on an answer that came from the inbox: the
        /// key's operation was executed before and this is its saved answer.
        pub const REPLAYED_HEADER: &str = "idempotent-replayed";
        /// Request metadata (value `true`) that forbids execution: CreateUser answers from
        /// the inbox or with NOT_FOUND, and never creates.
        pub const REPLAY_ONLY_HEADER: &str = "idempotency-replay-only";
        /// Request metadata: when the caller issued the idempotency key (RFC 3339). A key
        /// older than Users' inbox retention and not in the inbox is refused with
        /// FAILED_PRECONDITION, reason `DELIVERY_EXPIRED`: Users cannot tell "never
        /// executed" from "executed and purged", so it executes nothing.
        pub const KEY_CREATED_AT_HEADER: &str = "idempotency-key-created-at";

        /// Encoded descriptors of `users.v1` and its imports, for server reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("users_descriptor");
    }
}
