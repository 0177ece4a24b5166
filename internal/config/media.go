package config

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Media is the media section (docs/media.md): where kf-producer and the
// consumer keep the media customers send before WeChat's media_id
// expires (3 days). Both daemons read it and must name the same store.
type Media struct {
	// Store is dir (a directory, media.dir), s3 (media.s3) or off (media
	// are not kept; kfpipe.OpenMedia returns ErrNoMediaStore). Off, the
	// other media keys are not checked.
	Store string `mapstructure:"store" default:"dir" enum:"dir|s3|off"`
	// Dir is the directory of store dir; production defaults to
	// /var/lib/kfpipe/media, test to kfpipe-media in the system's
	// temporary directory.
	Dir string `mapstructure:"dir"`
	// MaxBytes bounds an object; a larger one is refused with a reason
	// (default 20 MiB, WeChat's largest: a file).
	MaxBytes int `mapstructure:"max_bytes" default:"20971520" range:"[1024, 1073741824]"`
	// Retries of a failed download or store write ...
	Retries int `mapstructure:"retries" default:"3" range:"[0, 20]"`
	// RetryBase ... waiting this long, doubled each time.
	RetryBase time.Duration `mapstructure:"retry_base" default:"200ms" range:"[10ms, 1m]"`
	// Workers is how many downloads kf-producer's keeping stage runs at a
	// time ...
	Workers int `mapstructure:"workers" default:"4" range:"[1, 256]"`
	// QueueSize ... and how many media jobs wait for them.
	QueueSize int     `mapstructure:"queue_size" default:"1000" range:"[1, 1_000_000]"`
	S3        MediaS3 `mapstructure:"s3"`
}

// BoundsApply reports whether the section's bounds are checked: not when
// media are off.
func (m Media) BoundsApply() bool { return m.Store != "off" }

// MediaS3 is media.s3: an S3-compatible server.
type MediaS3 struct {
	// Endpoint is the server, host:port (tls picks https).
	Endpoint string `mapstructure:"endpoint"`
	// Bucket is the bucket media are kept in: 3 to 63 characters of
	// [a-z0-9.-].
	Bucket string `mapstructure:"bucket"`
	// Region is the bucket's region (servers other than AWS accept any).
	Region string `mapstructure:"region"`
	// AccessKey and secret_key authenticate (both or neither); from the
	// environment (KFPIPE_MEDIA_S3_ACCESS_KEY).
	AccessKey string `mapstructure:"access_key"`
	// SecretKey is access_key's secret; from the environment
	// (KFPIPE_MEDIA_S3_SECRET_KEY).
	SecretKey string `mapstructure:"secret_key"`
	// Prefix starts every object's name (no leading /).
	Prefix string `mapstructure:"prefix"`
	// TLS talks https to the endpoint.
	TLS bool `mapstructure:"tls"`
}

// defaultMediaDir is media.dir's default, by environment.
func defaultMediaDir(env string) string {
	switch env {
	case EnvProduction:
		return "/var/lib/kfpipe/media"
	case EnvTest: // tests run in their package's directory: not there
		return filepath.Join(os.TempDir(), "kfpipe-media")
	}
	return ".run/media"
}

func (m Media) validate(v *validator) {
	if m.Store == "off" {
		return
	}
	switch m.Store {
	case "dir":
		v.nonEmpty("media.dir", m.Dir)
	case "s3":
		s := m.S3
		v.nonEmpty("media.s3.endpoint", s.Endpoint)
		if strings.Contains(s.Endpoint, "://") || strings.Contains(s.Endpoint, "/") {
			v.addf("media.s3.endpoint", "must be host:port without a scheme or path (media.s3.tls picks https), got %q", s.Endpoint)
		}
		v.nonEmpty("media.s3.bucket", s.Bucket)
		if b := s.Bucket; b != "" && (len(b) < 3 || len(b) > 63 || strings.Trim(b, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "") {
			v.addf("media.s3.bucket", "must be 3 to 63 characters of [a-z0-9.-], got %q", b)
		}
		if (s.AccessKey == "") != (s.SecretKey == "") {
			v.addf("media.s3.secret_key", "and media.s3.access_key must be set together")
		}
		if strings.HasPrefix(s.Prefix, "/") {
			v.addf("media.s3.prefix", "must not start with /, got %q", s.Prefix)
		}
	}
}
