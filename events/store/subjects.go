package store

// The names a bucket has on the wire: its stream (KV_<bucket>) and the subjects of its
// keys (a put of key in bucket is published on $KV.<bucket>.<key>, where a direct get
// finds it and where permissions, exports and the write service match it). The one
// home of those shapes.

// KeyPrefix starts the subject of every key of bucket: "$KV.<bucket>.".
func KeyPrefix(bucket string) string { return "$KV." + bucket + "." }

// KeySubject is the subject of key in bucket; key may hold wildcards ("*", ">") to make
// a filter.
func KeySubject(bucket, key string) string { return KeyPrefix(bucket) + key }

// BucketStream is the name of the stream that holds bucket: "KV_<bucket>".
func BucketStream(bucket string) string { return "KV_" + bucket }
