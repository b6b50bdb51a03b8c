package store

// The subjects of a bucket's keys: a put of key in bucket is published on
// $KV.<bucket>.<key>, where a direct get finds it and where permissions, exports and
// the write service match it. The one home of that shape.

// KeyPrefix starts the subject of every key of bucket: "$KV.<bucket>.".
func KeyPrefix(bucket string) string { return "$KV." + bucket + "." }

// KeySubject is the subject of key in bucket; key may hold wildcards ("*", ">") to make
// a filter.
func KeySubject(bucket, key string) string { return KeyPrefix(bucket) + key }
