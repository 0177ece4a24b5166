package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// EnvS3 is the S3-compatible server scripts/s3.sh starts (SeaweedFS's S3
// gateway): "host:port". Its credentials are S3AccessKey and S3SecretKey.
const EnvS3 = "KFPIPE_TEST_S3"

// The credentials scripts/s3.sh gives the test server.
const (
	S3AccessKey = "kfpipe-test"
	S3SecretKey = "kfpipe-test-secret"
)

// S3Endpoint returns the test S3 server's host:port.
func S3Endpoint(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvS3)
	if addr == "" {
		missing(t, "S3 server", fmt.Errorf("%s not set", EnvS3))
	}
	if err := reachable(addr); err != nil {
		missing(t, "S3 server at "+addr, err)
	}
	return addr
}

// Bucket returns a fresh bucket name for t (S3's rules: 3–63 characters
// of [a-z0-9-]).
func Bucket(t testing.TB) string {
	name := strings.ToLower(Name(t, "b"))
	if len(name) > 63 {
		name = name[:50] + "-" + Short()
	}
	return name
}
