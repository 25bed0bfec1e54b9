package testkube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestControlPlane: a pod is refused until its namespace's default service
// account exists (admission is real), then stored; Stop leaves nothing.
func TestControlPlane(t *testing.T) {
	c := New(t, DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := c.AdminClient(ctx, t, "smoke")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := client.CoreV1().Pods("smoke").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := pod.DeepCopy()
	bad.Name, bad.Spec.Containers[0].Image = "q", ""
	if _, err := client.CoreV1().Pods("smoke").Create(ctx, bad, metav1.CreateOptions{}); err == nil {
		t.Fatal("a pod without an image was accepted")
	}
}
