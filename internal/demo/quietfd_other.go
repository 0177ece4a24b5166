//go:build !unix

package demo

func withoutStderr(f func()) { f() }
