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
	// Store is dir (default), s3 or off.
	Store string `mapstructure:"store"`
	// Dir is the directory of store dir.
	Dir string `mapstructure:"dir"`
	// MaxBytes bounds an object; a larger one is refused with a reason,
	// 1 KiB … 1 GiB (default 20 MiB, WeChat's largest: a file).
	MaxBytes int `mapstructure:"max_bytes"`
	// Retries (0 … 20) of a failed download or store write, waiting
	// RetryBase (10ms … 1m) doubled each time.
	Retries   int           `mapstructure:"retries"`
	RetryBase time.Duration `mapstructure:"retry_base"`
	// Workers (1 … 256) and QueueSize (1 … 1,000,000) size kf-producer's
	// keeping stage.
	Workers   int     `mapstructure:"workers"`
	QueueSize int     `mapstructure:"queue_size"`
	S3        MediaS3 `mapstructure:"s3"`
}

// MediaS3 is media.s3: an S3-compatible server.
type MediaS3 struct {
	Endpoint  string `mapstructure:"endpoint"` // host:port
	Bucket    string `mapstructure:"bucket"`
	Region    string `mapstructure:"region"`
	AccessKey string `mapstructure:"access_key"`
	SecretKey string `mapstructure:"secret_key"`
	Prefix    string `mapstructure:"prefix"`
	TLS       bool   `mapstructure:"tls"`
}

func defaultMedia(env string) Media {
	dir := ".run/media"
	switch env {
	case EnvProduction:
		dir = "/var/lib/kfpipe/media"
	case EnvTest: // tests run in their package's directory: not there
		dir = filepath.Join(os.TempDir(), "kfpipe-media")
	}
	return Media{Store: "dir", Dir: dir, MaxBytes: 20 << 20, Retries: 3, RetryBase: 200 * time.Millisecond,
		Workers: 4, QueueSize: 1000}
}

func (m Media) validate(v *validator) {
	v.oneOf("media.store", m.Store, "dir", "s3", "off")
	if m.Store == "off" {
		return
	}
	v.between("media.max_bytes", m.MaxBytes, 1<<10, 1<<30)
	v.between("media.retries", m.Retries, 0, 20)
	v.durationBetween("media.retry_base", m.RetryBase, 10*time.Millisecond, time.Minute)
	v.between("media.workers", m.Workers, 1, 256)
	v.between("media.queue_size", m.QueueSize, 1, 1_000_000)
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
